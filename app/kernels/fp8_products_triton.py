"""Products of FP8 weights with 16-bit x on FP8 tensor cores, x quantized as the FP8 checkpoints declare it:
dynamically, to e4m3, one scale per token (compressed-tensors' `input_activations: {dynamic, strategy: token}`,
the per-channel checkpoints) or per token and block column of the weight (`activation_scheme: dynamic` with
`weight_block_size`, the block checkpoints: a scale per 128 inputs),

    x[t, group] = s[t, group] * q[t, group],   s = max|x[t, group]| / 448,   q = e4m3(x / s),

and W @ x^T one FP8 x FP8 product of the stored weight and q, both operands straight from shared memory: nothing is
converted in the products' loop. A per-channel weight scale and s[t] multiply the float32 sums once; with block
scales each step's sums (a step lies inside one block column) take their weight block's and their x group's scales.

This is the checkpoints' own numerics (W8A8, as their releases are served), at half the tensor work of keeping
x's 16 bits: the twenty-sixth session split x into two e4m3 terms (hi + lo / 16, about bf16's 8 bits) for two
products a step, and GLM-4.5-Air's q_proj at a 128-token chunk then took 30.7 us per channel and 40.1 block-128
against bf16 cuBLAS's 28.8 on the H200 (bench/NOTES.md). One token and verify blocks (T <= DECODE_TOKENS) keep x's
16 bits on CUDA cores (rows_times_vector_triton.py).

Needs FP8 tensor cores (sm_89 and newer, or Triton's interpreter) and 16-bit x (`runs_fp8_products`): float32 x
keeps the float32 products of the converting kernels. Used by prefill chunks' dense products (fp8_linear_triton.py)
and grouped expert products (glu_experts_triton.py).
"""

import torch
import triton
import triton.language as tl

from app.kernels.expert_tiles import DECODE_TOKENS
from app.kernels.fp8_bytes import reads_fp8_as_bytes

E4M3_MAX = tl.constexpr(448.0)
QUANTIZE_BLOCK = 1024  # inputs a quantizing program reads a step


def runs_fp8_products(x: torch.Tensor, weight: torch.Tensor) -> bool:
    """Whether x [T, in] meets FP8 weights in FP8 products: more tokens than a verify block, 16-bit x, a weight
    stored as e4m3 on a device with FP8 tensor cores (or in the interpreter)."""
    return (
        x.shape[0] > DECODE_TOKENS and x.dtype in (torch.bfloat16, torch.float16)
        and weight.dtype == torch.float8_e4m3fn and not reads_fp8_as_bytes(x.device)
    )


def quantize_activations(x: torch.Tensor, group: int | None) -> tuple[torch.Tensor, torch.Tensor]:
    """x [T, in] bf16 / fp16 -> (q [T, in] e4m3, s float32), as the module docstring says: s [T] for `group` None
    (a scale per token), else [T, ceil(in / group)] (a scale per `group` inputs)."""
    assert x.is_contiguous() and x.dtype in (torch.bfloat16, torch.float16), "contiguous 16-bit rows"
    tokens, inputs = x.shape
    size = inputs if group is None else group
    groups = triton.cdiv(inputs, size)
    q = torch.empty((tokens, inputs), dtype=torch.float8_e4m3fn, device=x.device)
    scale = torch.empty((tokens,) if group is None else (tokens, groups), dtype=torch.float32, device=x.device)
    block = min(QUANTIZE_BLOCK, triton.next_power_of_2(size))
    _quantize_kernel[(tokens, groups)](x, q, scale, inputs, size, BLOCK=block, num_warps=4)
    return q, scale


def input_terms(x: torch.Tensor, fp8: bool, group: int | None) -> tuple[torch.Tensor, torch.Tensor]:
    """What a kernel with an FP8 constant takes for its two input pointers: x quantized (`quantize_activations`)
    where `fp8`, else x in both."""
    return quantize_activations(x, group) if fp8 else (x, x)


@triton.jit
def _quantize_kernel(x_ptr, q_ptr, scale_ptr, inputs, group_size, BLOCK: tl.constexpr):
    """Program (token, group): the group's inputs read twice (their largest magnitude, then q)."""
    token, group = tl.program_id(0), tl.program_id(1)
    row = token.to(tl.int64) * inputs
    begin = group * group_size
    end = tl.minimum(begin + group_size, inputs)
    columns = tl.arange(0, BLOCK)
    largest = tl.zeros((BLOCK,), tl.float32)
    for first in range(begin, end, BLOCK):
        x = tl.load(x_ptr + row + first + columns, mask=first + columns < end, other=0.0).to(tl.float32)
        largest = tl.maximum(largest, tl.abs(x))
    scale = tl.maximum(tl.max(largest, axis=0), 1e-30) / E4M3_MAX  # a group of zeros: any scale gives zeros
    tl.store(scale_ptr + token * tl.num_programs(1) + group, scale)
    for first in range(begin, end, BLOCK):
        inside = first + columns < end
        x = tl.load(x_ptr + row + first + columns, mask=inside, other=0.0).to(tl.float32) / scale
        tl.store(q_ptr + row + first + columns, _on_e4m3_grid(x).to(tl.float8e4nv), mask=inside)


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
    q_ptr, x_scale_ptr, rows, used, w_rows, s_rows, row_ok, k_begin, k_end, k_size,
    SCALES: tl.constexpr, SCALE_COLS: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
):
    """W[:, k_begin:k_end] @ x[rows, k_begin:k_end]^T -> [BLOCK_N, BLOCK_M] float32, x given quantized (q [*, k_size]
    e4m3 and its scales: per row, or per row and block column where SCALES is a block's), unused rows giving 0; the
    weight rows start at `w_rows` ([BLOCK_N] pointers to e4m3), scaled as SCALES says from `s_rows`
    (glu_experts_triton._row_pointers)."""
    depth = tl.arange(0, BLOCK_K)
    w_ptrs = w_rows[:, None] + k_begin + depth[None, :]  # [BLOCK_N, BLOCK_K]
    q_offsets = rows[:, None].to(tl.int64) * k_size + k_begin + depth[None, :]  # [BLOCK_M, BLOCK_K]
    acc = tl.zeros((BLOCK_N, BLOCK_M), tl.float32)
    for k0 in range(k_begin, k_end, BLOCK_K):
        inside = depth < k_end - k0
        w = tl.load(w_ptrs, mask=row_ok[:, None] & inside[None, :], other=0.0)
        q = tl.load(q_ptr + q_offsets, mask=used[:, None] & inside[None, :], other=0.0)
        if SCALES == 2:
            block = k0 // SCALE_COLS
            w_scale = tl.load(s_rows + block, mask=row_ok, other=0.0).to(tl.float32)
            x_scale = tl.load(x_scale_ptr + rows * tl.cdiv(k_size, SCALE_COLS) + block, mask=used, other=0.0)
            acc += tl.dot(w, tl.trans(q)) * (w_scale[:, None] * x_scale[None, :])
        else:
            acc = tl.dot(w, tl.trans(q), acc)
        w_ptrs += BLOCK_K
        q_offsets += BLOCK_K
    if SCALES == 2:
        return acc
    x_scale = tl.load(x_scale_ptr + rows, mask=used, other=0.0)
    return acc * (tl.load(s_rows, mask=row_ok, other=0.0).to(tl.float32)[:, None] * x_scale[None, :])
