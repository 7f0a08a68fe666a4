"""Building blocks shared by the model files: RMSNorm, attention masks, attention with optional sinks."""

import torch


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """Normalise in float32, scale, return in x's dtype."""
    x32 = x.float()
    normed = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + eps)
    return (weight * normed).to(x.dtype)


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
    """q [T, Hq, d], k/v [L, Hkv, d], visible [T, L], sinks [Hq] -> [T, Hq, d].

    Grouped-query attention; a sink is an extra logit per head that joins the softmax and is then
    dropped, so a head can attend to "nothing".
    """
    groups = q.shape[1] // k.shape[1]
    k = k.repeat_interleave(groups, dim=1).transpose(0, 1)  # [Hq, L, d]
    v = v.repeat_interleave(groups, dim=1).transpose(0, 1)
    scores = torch.matmul(q.transpose(0, 1), k.transpose(1, 2)) * scale  # [Hq, T, L]
    scores = scores.masked_fill(~visible, float("-inf"))
    if sinks is not None:
        sink_column = sinks.to(scores.dtype)[:, None, None].expand(-1, scores.shape[1], 1)
        scores = torch.cat((scores, sink_column), dim=-1)
    probs = torch.softmax(scores - scores.amax(dim=-1, keepdim=True), dim=-1)
    if sinks is not None:
        probs = probs[..., :-1]
    return torch.matmul(probs.to(v.dtype), v).transpose(0, 1)
