"""One row's rotary dims, rotated, for the Triton kernels of the latent attention (latent_cache_triton.py,
head_products_triton.py): by halves, or by interleaved pairs whose result comes de-interleaved (evens, then odds)
as rotary_cache.rotate_pairs returns it."""

import triton
import triton.language as tl


@triton.jit
def rotated(row_ptr, cos_ptr, sin_ptr, token, ROTARY: tl.constexpr, BLOCK: tl.constexpr, INTERLEAVED: tl.constexpr):
    """row_ptr: a row's first rotary dim; cos/sin [T, ROTARY / 2] -> (the rotated dims [BLOCK] in float32, the mask
    of those < ROTARY). Output dim i < ROTARY / 2 is x cos - partner sin, past it x cos + partner sin."""
    half: tl.constexpr = ROTARY // 2
    dim = tl.arange(0, BLOCK)
    inside = dim < ROTARY
    pair = dim % half
    first = dim < half
    if INTERLEAVED:  # output i < half reads x_2i and its partner x_2i+1; past half, x_2j+1 and x_2j
        source = 2 * pair + tl.where(first, 0, 1)
        partner = 2 * pair + tl.where(first, 1, 0)
    else:
        source = dim
        partner = tl.where(first, dim + half, dim - half)
    x = tl.load(row_ptr + source, mask=inside, other=0.0).to(tl.float32)
    other = tl.load(row_ptr + partner, mask=inside, other=0.0).to(tl.float32)
    cos = tl.load(cos_ptr + token * half + pair, mask=inside, other=0.0).to(tl.float32)
    sin = tl.load(sin_ptr + token * half + pair, mask=inside, other=0.0).to(tl.float32)
    return x * cos + tl.where(first, -other, other) * sin, inside
