"""The rotary embedding and KV-cache write of rotary_cache.py in one Triton kernel: one program per
(token, head), query heads first, then key heads (rotated into the cache), then value heads (copied). A program
holds its whole head, and the partner of each rotated dim (d ± r/2) from a second load of the same row."""

import torch
import triton
import triton.language as tl

from app.kernels.dependent_launch import after_earlier_kernels, dependent_launch


def run_rotary_cache_write(
    qkv: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, positions: torch.Tensor,
    keys: torch.Tensor, values: torch.Tensor,
    bias: torch.Tensor | None, head_norms: torch.Tensor | None, eps: float,
) -> torch.Tensor:
    """qkv [T, Hq + 2 Hkv, d], cos/sin [T, r/2], positions [T], keys/values [C, Hkv, d], bias [(Hq + 2 Hkv) d],
    head_norms [2, d] -> queries [T, Hq, d]."""
    tokens, all_heads, dim = qkv.shape
    kv_heads = keys.shape[1]
    heads = all_heads - 2 * kv_heads
    half = cos.shape[1]
    assert cos.shape == sin.shape == (tokens, half) and 2 * half <= dim, "rotary over at most whole heads"
    assert keys.shape[1:] == values.shape[1:] == (kv_heads, dim) and keys.is_contiguous() and values.is_contiguous()
    assert dim & (dim - 1) == 0, "head dims are powers of two"
    assert bias is None or bias.shape == (all_heads * dim,)
    assert head_norms is None or head_norms.shape == (2, dim)
    qkv, cos, sin = qkv.contiguous(), cos.contiguous(), sin.contiguous()
    queries = torch.empty((tokens, heads, dim), dtype=qkv.dtype, device=qkv.device)
    _rotary_cache_kernel[(tokens, all_heads)](
        qkv, cos, sin, positions, keys, values, queries, qkv if bias is None else bias.contiguous(),
        qkv if head_norms is None else head_norms.contiguous(), heads, kv_heads, eps,
        DIM=dim, HALF=half, HAS_BIAS=bias is not None, HAS_NORMS=head_norms is not None, num_warps=1,
        **dependent_launch(qkv.device),
    )
    return queries


@triton.jit
def _rotary_cache_kernel(qkv_ptr, cos_ptr, sin_ptr, positions_ptr, keys_ptr, values_ptr, queries_ptr, bias_ptr,
                         norms_ptr, heads, kv_heads, eps,
                         DIM: tl.constexpr, HALF: tl.constexpr, HAS_BIAS: tl.constexpr, HAS_NORMS: tl.constexpr,
                         PDL: tl.constexpr):
    after_earlier_kernels(PDL)
    token, head = tl.program_id(0).to(tl.int64), tl.program_id(1)
    all_heads = heads + 2 * kv_heads
    dim = tl.arange(0, DIM)
    rotated = dim < 2 * HALF
    partner = tl.where(dim < HALF, dim + HALF, dim - HALF)
    source = qkv_ptr + (token * all_heads + head) * DIM
    x = tl.load(source + dim).to(tl.float32)
    other = tl.load(source + partner, mask=rotated, other=0.0).to(tl.float32)
    out_type = queries_ptr.dtype.element_ty
    if HAS_BIAS:  # rounded as the reference's sum is
        x = (x + tl.load(bias_ptr + head * DIM + dim).to(tl.float32)).to(out_type).to(tl.float32)
        partner_bias = tl.load(bias_ptr + head * DIM + partner, mask=rotated, other=0.0).to(tl.float32)
        other = (other + partner_bias).to(out_type).to(tl.float32)
    row = tl.load(positions_ptr + token).to(tl.int64)
    if head < heads + kv_heads:
        if HAS_NORMS:
            norm = norms_ptr + (head >= heads).to(tl.int32) * DIM
            inverse = 1.0 / tl.sqrt(tl.sum(x * x, axis=0) / DIM + eps)
            x = (x * inverse * tl.load(norm + dim)).to(out_type).to(tl.float32)
            other = (other * inverse * tl.load(norm + partner, mask=rotated, other=0.0)).to(out_type).to(tl.float32)
        angle = token * HALF + dim % HALF
        cos = tl.load(cos_ptr + angle, mask=rotated, other=1.0).to(tl.float32)
        sin = tl.load(sin_ptr + angle, mask=rotated, other=0.0).to(tl.float32)
        # first half: x cos - partner sin; second half: x cos + partner sin; past the rotary dims: x
        out = x * cos + tl.where(dim < HALF, -other, other) * sin
        if head < heads:
            target = queries_ptr + (token * heads + head) * DIM
        else:
            target = keys_ptr + (row * kv_heads + head - heads) * DIM
        tl.store(target + dim, out.to(out_type))
    else:
        target = values_ptr + (row * kv_heads + head - heads - kv_heads) * DIM
        tl.store(target + dim, x.to(out_type))
