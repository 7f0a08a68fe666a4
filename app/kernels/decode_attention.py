"""Attention of one query token (batch-1 decode) or of a short block of them (a speculative verify) over a KV cache:
grouped-query heads (MLA's latent head too), optional sinks (an extra logit per head that joins the softmax and is
then dropped) and an optional sliding window.

`decode_attention` runs the Triton kernels of decode_attention_triton.py (two launches, reading only the rows
the query sees); `decode_attention_torch` is the reference with the same signature (the GPT-OSS model calls the
kernel where Triton runs and its masked `attend` elsewhere).
"""


import torch

MAX_QUERY_ROWS = 128  # a block's tokens x a key head's query heads: the rows of the kernel's products


def takes_queries(num_tokens: int, heads: int, kv_heads: int) -> bool:
    """Whether `decode_attention` runs a pass of `num_tokens` positions (more: the engine's masked attention)."""
    return num_tokens * (heads // kv_heads) <= MAX_QUERY_ROWS


def is_power_of_two(n: int) -> bool:
    return n > 0 and n & (n - 1) == 0


def takes_head_dim(dim: int) -> bool:
    """Whether the kernels take heads of `dim` dims (powers of two from 16)."""
    return dim >= 16 and is_power_of_two(dim)


def decode_attention_torch(
    q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, position: torch.Tensor, scale: float,
    sinks: torch.Tensor | None, window: int | None,
) -> torch.Tensor:
    """q [T, Hq, dk], keys [C, Hkv, dk], values [C, Hkv, dv] (rows past the last position ignored), position [T]
    (each query's row, non-decreasing: a verify block's consecutive rows, or a drafted block's last row for all),
    sinks [Hq] -> [T, Hq, dv] in q's dtype. Key j is seen by the query at p when j <= p (and p - j < window). MLA
    passes its latent rows as keys and their first kv_lora_rank columns as values."""
    groups = q.shape[1] // keys.shape[1]
    distance = position[:, None] - torch.arange(keys.shape[0], device=q.device)
    visible = (distance >= 0) & (distance < window if window is not None else True)  # [T, C]
    scores = torch.einsum("thd,chd->thc", q.float(), keys.repeat_interleave(groups, 1).float()) * scale
    scores = scores.masked_fill(~visible[:, None, :], float("-inf"))
    if sinks is not None:
        scores = torch.cat((scores, sinks.float()[None, :, None].expand(len(q), -1, 1)), dim=2)
    probs = torch.softmax(scores, dim=2)[..., : keys.shape[0]]
    return torch.einsum("thc,chd->thd", probs, values.repeat_interleave(groups, 1).float()).to(q.dtype)


def decode_attention(
    q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, position: torch.Tensor, scale: float,
    sinks: torch.Tensor | None, window: int | None,
) -> torch.Tensor:
    """`decode_attention_torch` in two Triton launches."""
    from app.kernels.decode_attention_triton import run_decode_attention  # Triton exists on Linux only

    return run_decode_attention(q, keys, values, position, scale, sinks, window)

