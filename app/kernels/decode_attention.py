"""Attention of one query token over a KV cache (batch-1 decode): grouped-query heads (MLA's latent head too),
optional sinks (an extra logit per head that joins the softmax and is then dropped) and an optional sliding window.

`decode_attention` runs the Triton kernels of decode_attention_triton.py (two launches, reading only the rows
the query sees); `decode_attention_torch` is the reference with the same signature (the GPT-OSS model calls the
kernel where Triton runs and its masked `attend` elsewhere).
"""


import torch


def decode_attention_torch(
    q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, position: torch.Tensor, scale: float,
    sinks: torch.Tensor | None, window: int | None,
) -> torch.Tensor:
    """q [1, Hq, dk], keys [C, Hkv, dk], values [C, Hkv, dv] (rows past `position` ignored), position [1] (the
    query's row), sinks [Hq] -> [1, Hq, dv] in q's dtype. Key j is seen when j <= position (and position - j <
    window). MLA passes its latent rows as keys and their first kv_lora_rank columns as values."""
    groups = q.shape[1] // keys.shape[1]
    distance = position - torch.arange(keys.shape[0], device=q.device)
    visible = (distance >= 0) & (distance < window if window is not None else True)
    scores = torch.einsum("hd,chd->hc", q[0].float(), keys.repeat_interleave(groups, 1).float()) * scale
    scores = scores.masked_fill(~visible, float("-inf"))
    if sinks is not None:
        scores = torch.cat((scores, sinks.float()[:, None]), dim=1)
    probs = torch.softmax(scores, dim=1)[:, : keys.shape[0]]
    return torch.einsum("hc,chd->hd", probs, values.repeat_interleave(groups, 1).float())[None].to(q.dtype)


def decode_attention(
    q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, position: torch.Tensor, scale: float,
    sinks: torch.Tensor | None, window: int | None,
) -> torch.Tensor:
    """`decode_attention_torch` in two Triton launches."""
    from app.kernels.decode_attention_triton import run_decode_attention  # Triton exists on Linux only

    return run_decode_attention(q, keys, values, position, scale, sinks, window)

