"""Products of FP8 weights with 16-bit x on FP8 tensor cores: x split once into two e4m3 terms per row,

    x[t] = s[t] * (hi[t] + lo[t] / LO_LIFT),   s[t] = max|x[t]| / 448,
    hi = e4m3(x / s),   lo = e4m3(LO_LIFT * (x / s - hi)),

and W @ x^T as two FP8 x FP8 products of the stored weight, both operands straight from shared memory: nothing is
converted in the products' loop. (Converting each FP8 weight to float16 in registers before the tensor cores held
GLM's q_proj at T = 128 to 60 us against bf16 cuBLAS's 37 on the H200.) Each term keeps e4m3's 4 significant bits,
the pair about 8 (bf16 keeps 8): hi's rounding error is at most half a unit of its last place, 16 at the top of
e4m3's range, so lo = 16 x that error stays inside 448. A per-channel weight scale and s[t] multiply the float32
sums once; a block scale multiplies each step's sums (a step lies inside one block column), the two terms joined
first.

Needs FP8 tensor cores (sm_89 and newer, or Triton's interpreter) and 16-bit x (`runs_fp8_products`): float32 x
keeps the float32 products of the converting kernels. Used by prefill chunks' dense products (fp8_linear_triton.py)
and grouped expert products (glu_experts_triton.py).
"""

import torch
import triton
import triton.language as tl

from app.kernels.expert_tiles import DECODE_TOKENS
from app.kernels.fp8_bytes import reads_fp8_as_bytes

LO_LIFT = tl.constexpr(16.0)  # lo's scale below hi's: hi's rounding error, at most 16 (half of e4m3's ulp at 256-448)
E4M3_MAX = tl.constexpr(448.0)
SPLIT_BLOCK = 1024  # inputs a split program reads a step


def runs_fp8_products(x: torch.Tensor, weight: torch.Tensor) -> bool:
    """Whether x [T, in] meets FP8 weights in FP8 products: more tokens than a verify block, 16-bit x, a weight
    stored as e4m3 on a device with FP8 tensor cores (or in the interpreter)."""
    return (
        x.shape[0] > DECODE_TOKENS and x.dtype in (torch.bfloat16, torch.float16)
        and weight.dtype == torch.float8_e4m3fn and not reads_fp8_as_bytes(x.device)
    )


def split_activations(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """x [T, in] bf16 / fp16 -> (hi [T, in] e4m3, lo [T, in] e4m3, s [T] float32), as the module docstring says."""
    assert x.is_contiguous() and x.dtype in (torch.bfloat16, torch.float16), "contiguous 16-bit rows"
    tokens, inputs = x.shape
    hi = torch.empty((tokens, inputs), dtype=torch.float8_e4m3fn, device=x.device)
    lo = torch.empty_like(hi)
    scale = torch.empty(tokens, dtype=torch.float32, device=x.device)
    _split_kernel[(tokens,)](x, hi, lo, scale, inputs, BLOCK=SPLIT_BLOCK, num_warps=4)
    return hi, lo, scale


def input_terms(x: torch.Tensor, fp8: bool) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """What a kernel with an FP8 constant takes for its three input pointers: x's terms where `fp8`, else x in each."""
    return split_activations(x) if fp8 else (x, x, x)


@triton.jit
def _split_kernel(x_ptr, hi_ptr, lo_ptr, scale_ptr, inputs, BLOCK: tl.constexpr):
    """Program: one token's row, read twice (its largest magnitude, then the terms)."""
    row = tl.program_id(0).to(tl.int64) * inputs
    columns = tl.arange(0, BLOCK)
    largest = tl.zeros((BLOCK,), tl.float32)
    for first in range(0, inputs, BLOCK):
        x = tl.load(x_ptr + row + first + columns, mask=first + columns < inputs, other=0.0).to(tl.float32)
        largest = tl.maximum(largest, tl.abs(x))
    scale = tl.maximum(tl.max(largest, axis=0), 1e-30) / E4M3_MAX  # a row of zeros: any scale gives zeros
    tl.store(scale_ptr + tl.program_id(0), scale)
    for first in range(0, inputs, BLOCK):
        inside = first + columns < inputs
        x = tl.load(x_ptr + row + first + columns, mask=inside, other=0.0).to(tl.float32) / scale
        hi = _on_e4m3_grid(x)
        lo = _on_e4m3_grid((x - hi) * LO_LIFT)
        tl.store(hi_ptr + row + first + columns, hi.to(tl.float8e4nv), mask=inside)
        tl.store(lo_ptr + row + first + columns, lo.to(tl.float8e4nv), mask=inside)


@triton.jit
def _on_e4m3_grid(y):
    """float32 y (|y| <= 448) rounded to the nearest e4m3 value, ties to even, still float32: its conversion to e4m3
    is then exact (Triton's interpreter rounds float32 -> e4m3 wrongly, 127.1 to 64). e4m3 keeps 3 bits below the
    leading one, down to 2^-6; below that its subnormals are steps of 2^-9."""
    exponent = tl.maximum(((y.to(tl.int32, bitcast=True) >> 23) & 0xFF) - 127, -6)
    step = ((exponent - 3 + 127) << 23).to(tl.float32, bitcast=True)  # 2^(exponent - 3)
    per_step = ((3 - exponent + 127) << 23).to(tl.float32, bitcast=True)  # 1 / step, so that nothing divides
    # adding and taking away 1.5 * 2^23 rounds |y / step| < 2^22 to an integer, ties to even, in float32 itself
    return ((y * per_step + 12582912.0) - 12582912.0) * step


@triton.jit
def fp8_products(
    hi_ptr, lo_ptr, token_scale_ptr, rows, used, w_rows, s_rows, row_ok, k_begin, k_end, k_size,
    SCALES: tl.constexpr, SCALE_COLS: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
):
    """W[:, k_begin:k_end] @ x[rows, k_begin:k_end]^T -> [BLOCK_N, BLOCK_M] float32, x given as its terms (hi, lo
    [*, k_size] e4m3 and s per row), unused rows giving 0; the weight rows start at `w_rows` ([BLOCK_N] pointers to
    e4m3), scaled as SCALES says from `s_rows` (glu_experts_triton._row_pointers)."""
    depth = tl.arange(0, BLOCK_K)
    w_ptrs = w_rows[:, None] + k_begin + depth[None, :]  # [BLOCK_N, BLOCK_K]
    x_offsets = rows[:, None].to(tl.int64) * k_size + k_begin + depth[None, :]  # [BLOCK_M, BLOCK_K]
    acc = tl.zeros((BLOCK_N, BLOCK_M), tl.float32)
    acc_lo = tl.zeros((BLOCK_N, BLOCK_M), tl.float32)
    for k0 in range(k_begin, k_end, BLOCK_K):
        inside = depth < k_end - k0
        w = tl.load(w_ptrs, mask=row_ok[:, None] & inside[None, :], other=0.0)
        hi = tl.load(hi_ptr + x_offsets, mask=used[:, None] & inside[None, :], other=0.0)
        lo = tl.load(lo_ptr + x_offsets, mask=used[:, None] & inside[None, :], other=0.0)
        if SCALES == 2:
            sums = tl.dot(w, tl.trans(lo)) * (1.0 / LO_LIFT)
            sums = tl.dot(w, tl.trans(hi), sums)
            acc += sums * tl.load(s_rows + k0 // SCALE_COLS, mask=row_ok, other=0.0).to(tl.float32)[:, None]
        else:
            acc = tl.dot(w, tl.trans(hi), acc)
            acc_lo = tl.dot(w, tl.trans(lo), acc_lo)
        w_ptrs += BLOCK_K
        x_offsets += BLOCK_K
    if SCALES != 2:
        acc += acc_lo * (1.0 / LO_LIFT)
    if SCALES == 1:
        acc *= tl.load(s_rows, mask=row_ok, other=0.0).to(tl.float32)[:, None]
    return acc * tl.load(token_scale_ptr + rows, mask=used, other=0.0)[None, :]
