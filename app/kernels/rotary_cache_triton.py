"""The rotary embedding and KV-cache write of rotary_cache.py in one Triton kernel: one program per
(token, head), query heads first, then key heads (rotated into the cache), then value heads (copied)."""

import torch
import triton
import triton.language as tl


def run_rotary_cache_write(
    qkv: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, positions: torch.Tensor,
    keys: torch.Tensor, values: torch.Tensor,
) -> torch.Tensor:
    """qkv [T, Hq + 2 Hkv, d], cos/sin [T, d/2], positions [T], keys/values [C, Hkv, d] -> queries [T, Hq, d]."""
    tokens, all_heads, dim = qkv.shape
    kv_heads = keys.shape[1]
    heads = all_heads - 2 * kv_heads
    assert cos.shape == sin.shape == (tokens, dim // 2), "rotary over whole heads"
    assert keys.shape[1:] == values.shape[1:] == (kv_heads, dim) and keys.is_contiguous() and values.is_contiguous()
    assert dim & (dim - 1) == 0, "head dims are powers of two"
    qkv, cos, sin = qkv.contiguous(), cos.contiguous(), sin.contiguous()
    queries = torch.empty((tokens, heads, dim), dtype=qkv.dtype, device=qkv.device)
    _rotary_cache_kernel[(tokens, all_heads)](
        qkv, cos, sin, positions, keys, values, queries, heads, kv_heads, HALF=dim // 2, num_warps=1,
    )
    return queries


@triton.jit
def _rotary_cache_kernel(qkv_ptr, cos_ptr, sin_ptr, positions_ptr, keys_ptr, values_ptr, queries_ptr,
                         heads, kv_heads, HALF: tl.constexpr):
    token, head = tl.program_id(0).to(tl.int64), tl.program_id(1)
    all_heads = heads + 2 * kv_heads
    half = tl.arange(0, HALF)
    source = qkv_ptr + (token * all_heads + head) * 2 * HALF
    first, second = tl.load(source + half), tl.load(source + HALF + half)
    row = tl.load(positions_ptr + token).to(tl.int64)
    if head < heads + kv_heads:
        cos = tl.load(cos_ptr + token * HALF + half).to(tl.float32)
        sin = tl.load(sin_ptr + token * HALF + half).to(tl.float32)
        a, b = first.to(tl.float32), second.to(tl.float32)
        rotated_first = (a * cos - b * sin).to(queries_ptr.dtype.element_ty)
        rotated_second = (b * cos + a * sin).to(queries_ptr.dtype.element_ty)
        if head < heads:
            target = queries_ptr + (token * heads + head) * 2 * HALF
        else:
            target = keys_ptr + (row * kv_heads + head - heads) * 2 * HALF
        tl.store(target + half, rotated_first)
        tl.store(target + HALF + half, rotated_second)
    else:
        target = values_ptr + (row * kv_heads + head - heads - kv_heads) * 2 * HALF
        tl.store(target + half, first)
        tl.store(target + HALF + half, second)
