"""Building blocks shared by the model files: RMSNorm (app/kernels/norms.py), attention masks, attention with
optional sinks, the SiLU-gated MLP."""

import torch

from app.engine.layers.linear import Fp8Weight, linear
from app.kernels.silu_glu import silu_glu as kernel_silu_glu


def causal_mask(query_positions: torch.Tensor, num_keys: int, window: int | None) -> torch.Tensor:
    """Boolean [T, L]: key j is visible to the query at position p when j <= p (and p - j < window)."""
    keys = torch.arange(num_keys, device=query_positions.device)
    distance = query_positions[:, None] - keys[None, :]
    visible = distance >= 0
    if window is not None:
        visible &= distance < window
    return visible


def attend(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    visible: torch.Tensor,
    scale: float,
    sinks: torch.Tensor | None = None,
) -> torch.Tensor:
    """q [T, Hq, d], k [L, Hkv, d], v [L, Hkv, dv], visible [T, L], sinks [Hq] -> [T, Hq, dv].

    A group's queries are stacked into one product rather than copying its keys (MLA: 64 heads on one latent
    head). A sink is an extra logit per head, dropped after the softmax, so a head can attend to "nothing".
    """
    length, heads, dim = q.shape
    kv_heads, keys = k.shape[1], k.shape[0]
    groups = heads // kv_heads
    stacked = q.unflatten(1, (kv_heads, groups)).permute(1, 2, 0, 3).reshape(kv_heads, groups * length, dim)
    scores = torch.matmul(stacked, k.permute(1, 2, 0)).view(kv_heads, groups, length, keys) * scale
    scores = scores.masked_fill(~visible, float("-inf"))
    if sinks is not None:
        sink_column = sinks.to(scores.dtype).view(kv_heads, groups, 1, 1).expand(-1, -1, length, 1)
        scores = torch.cat((scores, sink_column), dim=-1)
    probs = torch.softmax(scores - scores.amax(dim=-1, keepdim=True), dim=-1)
    if sinks is not None:
        probs = probs[..., :-1]
    out = torch.matmul(probs.reshape(kv_heads, groups * length, keys).to(v.dtype), v.transpose(0, 1))
    return out.view(kv_heads, groups, length, -1).permute(2, 0, 1, 3).reshape(length, heads, -1)


def silu_glu(
    x: torch.Tensor, gate: torch.Tensor | Fp8Weight, up: torch.Tensor | Fp8Weight, down: torch.Tensor | Fp8Weight
) -> torch.Tensor:
    """Weights as tensors or as FP8."""
    return kernel_silu_glu(x, gate, up, down, linear)
