"""Rotary embedding of a pass's queries and keys with its keys and values written into the KV cache.

Beside the rotation the same pass can add the projections' bias (GLM's q/k/v biases) and normalise each query
and key head (GLM-4.5's q/k RMSNorm), as the layer does before rotating; the rotation may cover only the first
dims of a head (partial RoPE).

`rotary_cache_write` runs the Triton kernel of rotary_cache_triton.py (one launch for every head of every
token); `rotary_cache_write_torch` is the reference with the same signature; `rotary_cache_write_op` picks one
for a device.
"""

from collections.abc import Callable

import torch

from app.kernels.choice import kernel_or_reference
from app.kernels.norms import rms_norm


def rotate_halves(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x [T, heads, d], cos/sin [T, r/2]: the first r dims of each head rotate by halves (r < d is partial
    RoPE), the rest pass through."""
    rotary = 2 * cos.shape[-1]
    first, second = x[..., :rotary].chunk(2, dim=-1)
    cos, sin = cos[:, None, :], sin[:, None, :]
    return torch.cat((first * cos - second * sin, second * cos + first * sin, x[..., rotary:]), dim=-1)


def rotate_pairs(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x [T, heads, r], cos/sin [T, r/2]: interleaved RoPE. The result is de-interleaved (evens, then odds), as in
    transformers; queries and keys share that order, so their dot products are unchanged."""
    return rotate_halves(torch.cat((x[..., 0::2], x[..., 1::2]), dim=-1), cos, sin)


def rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, interleaved: bool) -> torch.Tensor:
    """`rotate_pairs` where the rope interleaves its pairs (GLM's MLA), else `rotate_halves`."""
    return rotate_pairs(x, cos, sin) if interleaved else rotate_halves(x, cos, sin)


def rotary_cache_write_torch(
    qkv: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, positions: torch.Tensor,
    keys: torch.Tensor, values: torch.Tensor,
    bias: torch.Tensor | None = None, head_norms: torch.Tensor | None = None, eps: float = 0.0,
) -> torch.Tensor:
    """qkv [T, Hq + 2 Hkv, d] (queries, keys, values), cos/sin [T, r/2] (r <= d), positions [T] -> the rotated
    queries [T, Hq, d]; the rotated keys and the values go to rows `positions` of keys/values [C, Hkv, d].
    bias [(Hq + 2 Hkv) d] is added first; head_norms [2, d] float32 (the query heads' RMSNorm weight, then the key
    heads') normalise each query and key head before the rotation."""
    kv_heads = keys.shape[1]
    heads = qkv.shape[1] - 2 * kv_heads
    if bias is not None:
        qkv = qkv + bias.view(qkv.shape[1:])
    q, k = qkv[:, :heads], qkv[:, heads : heads + kv_heads]
    if head_norms is not None:
        q, k = rms_norm(q, head_norms[0], eps), rms_norm(k, head_norms[1], eps)
    rotated = rotate_halves(torch.cat((q, k), dim=1), cos, sin)  # queries and keys in one pass
    keys.index_copy_(0, positions, rotated[:, heads:])
    values.index_copy_(0, positions, qkv[:, heads + kv_heads :])
    return rotated[:, :heads]


def rotary_cache_write(
    qkv: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, positions: torch.Tensor,
    keys: torch.Tensor, values: torch.Tensor,
    bias: torch.Tensor | None = None, head_norms: torch.Tensor | None = None, eps: float = 0.0,
) -> torch.Tensor:
    """`rotary_cache_write_torch` in one Triton launch."""
    from app.kernels.rotary_cache_triton import run_rotary_cache_write  # Triton exists on Linux only

    return run_rotary_cache_write(qkv, cos, sin, positions, keys, values, bias, head_norms, eps)


def rotary_cache_write_op(device: torch.device) -> Callable[..., torch.Tensor]:
    return kernel_or_reference(device, rotary_cache_write, rotary_cache_write_torch)
