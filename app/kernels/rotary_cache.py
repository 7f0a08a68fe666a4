"""Rotary embedding of a pass's queries and keys with its keys and values written into the KV cache.

`rotary_cache_write` runs the Triton kernel of rotary_cache_triton.py (one launch for every head of every
token); `rotary_cache_write_torch` is the reference with the same signature; `rotary_cache_write_op` picks one
for a device.
"""

from collections.abc import Callable

import torch

from app.kernels.choice import kernel_or_reference


def rotate_halves(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x [T, heads, d], cos/sin [T, r/2]: the first r dims of each head rotate by halves (r < d is partial
    RoPE), the rest pass through."""
    rotary = 2 * cos.shape[-1]
    first, second = x[..., :rotary].chunk(2, dim=-1)
    cos, sin = cos[:, None, :], sin[:, None, :]
    return torch.cat((first * cos - second * sin, second * cos + first * sin, x[..., rotary:]), dim=-1)


def rotary_cache_write_torch(
    qkv: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, positions: torch.Tensor,
    keys: torch.Tensor, values: torch.Tensor,
) -> torch.Tensor:
    """qkv [T, Hq + 2 Hkv, d] (queries, keys, values), cos/sin [T, d/2], positions [T] -> the rotated queries
    [T, Hq, d]; the rotated keys and the values go to rows `positions` of keys/values [C, Hkv, d]."""
    kv_heads = keys.shape[1]
    heads = qkv.shape[1] - 2 * kv_heads
    rotated = rotate_halves(qkv[:, : heads + kv_heads], cos, sin)  # queries and keys in one pass
    keys.index_copy_(0, positions, rotated[:, heads:])
    values.index_copy_(0, positions, qkv[:, heads + kv_heads :])
    return rotated[:, :heads]


def rotary_cache_write(
    qkv: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, positions: torch.Tensor,
    keys: torch.Tensor, values: torch.Tensor,
) -> torch.Tensor:
    """`rotary_cache_write_torch` in one Triton launch."""
    from app.kernels.rotary_cache_triton import run_rotary_cache_write  # Triton exists on Linux only

    return run_rotary_cache_write(qkv, cos, sin, positions, keys, values)


def rotary_cache_write_op(device: torch.device) -> Callable[..., torch.Tensor]:
    return kernel_or_reference(device, rotary_cache_write, rotary_cache_write_torch)
