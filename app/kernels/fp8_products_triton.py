"""Products of FP8 weights with 16-bit x on FP8 tensor cores, x quantized dynamically to e4m3 with one scale per
token, as the FP8 checkpoints declare their activations (compressed-tensors' `input_activations: {dynamic,
strategy: token}`; the block checkpoints' `activation_scheme: dynamic`, whose reference groups 128 inputs a scale),

    x[t] = s[t] * q[t],   s[t] = max|x[t]| / 448,   q = e4m3(x / s),

and W @ x^T one FP8 x FP8 product of the stored weight and q, both operands straight from shared memory: nothing is
converted in the products' loop. A per-channel weight scale and s[t] multiply the float32 sums once; with block
scales each step's sums (a step lies inside one block column) take their weight block's scale, and s[t] the total.

Why one scale a token for the block checkpoints too: x's scale per 128 inputs is a per-step gather in the products'
loop, and GLM-4.5-Air's q_proj at a 128-token chunk took 54.5-96 us with it against 28.5-29.0 us with a scale a
token and 37.9-39.6 for bf16 cuBLAS (H100, bench/NOTES.md); e4m3's exponent keeps 4 significant bits down to 2^-15 of a
token's largest value either way. And why e4m3 x at all: x split into two e4m3 terms (hi + lo / 16, about bf16's 8
bits) took two products a step, and q_proj at 128 tokens 30.7 us per channel, 40.1 block-128, against bf16 cuBLAS's
28.8 on the H200. One token and verify blocks (T <= DECODE_TOKENS) keep x's 16 bits on CUDA cores
(rows_times_vector_triton.py).

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
MAX_ROW = 32768  # inputs a quantizing program holds in registers (the widest FP8 product's: GLM-5's o_proj, 16384)


def runs_fp8_products(x: torch.Tensor, weight: torch.Tensor) -> bool:
    """Whether x [T, in] meets FP8 weights in FP8 products: more tokens than a verify block, 16-bit x, a weight
    stored as e4m3 on a device with FP8 tensor cores (or in the interpreter)."""
    return (
        x.shape[0] > DECODE_TOKENS and x.dtype in (torch.bfloat16, torch.float16)
        and weight.dtype == torch.float8_e4m3fn and not reads_fp8_as_bytes(x.device)
    )


def quantize_activations(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """x [T, in] bf16 / fp16 -> (q [T, in] e4m3, s [T] float32), as the module docstring says."""
    assert x.is_contiguous() and x.dtype in (torch.bfloat16, torch.float16), "contiguous 16-bit rows"
    tokens, inputs = x.shape
    assert inputs <= MAX_ROW, f"rows of {inputs} inputs are wider than the {MAX_ROW} a program holds"
    q = torch.empty((tokens, inputs), dtype=torch.float8_e4m3fn, device=x.device)
    scale = torch.empty(tokens, dtype=torch.float32, device=x.device)
    block = triton.next_power_of_2(inputs)
    _quantize_kernel[(tokens,)](x, q, scale, inputs, BLOCK=block, num_warps=min(16, max(4, block // 1024)))
    return q, scale


def input_terms(x: torch.Tensor, fp8: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """What a kernel with an FP8 constant takes for its two input pointers: x quantized (`quantize_activations`)
    where `fp8`, else x in both."""
    return quantize_activations(x) if fp8 else (x, x)


@triton.jit
def _quantize_kernel(x_ptr, q_ptr, scale_ptr, inputs, BLOCK: tl.constexpr):
    """Program: one token's row, read once and held in registers (3.1 us for a 256-token chunk of 4096 inputs on
    the H100, bench/NOTES.md)."""
    row = tl.program_id(0).to(tl.int64) * inputs
    columns = tl.arange(0, BLOCK)
    inside = columns < inputs
    x = tl.load(x_ptr + row + columns, mask=inside, other=0.0).to(tl.float32)
    # times 1 / 448 rounded to float32, as torch's division by a number is on CUDA; a row of zeros: any scale
    scale = tl.maximum(tl.max(tl.abs(x), axis=0), 1e-30) * (1.0 / E4M3_MAX)
    tl.store(scale_ptr + tl.program_id(0), scale)
    tl.store(q_ptr + row + columns, _on_e4m3_grid(tl.math.div_rn(x, scale)).to(tl.float8e4nv), mask=inside)


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
    e4m3 and a scale per row), unused rows giving 0; the weight rows start at `w_rows` ([BLOCK_N] pointers to
    e4m3), scaled as SCALES says from `s_rows` (glu_experts_triton._row_pointers)."""
    depth = tl.arange(0, BLOCK_K)
    w_ptrs = w_rows[:, None] + k_begin + depth[None, :]  # [BLOCK_N, BLOCK_K]
    q_offsets = rows[:, None].to(tl.int64) * k_size + k_begin + depth[None, :]  # [BLOCK_M, BLOCK_K]
    acc = tl.zeros((BLOCK_N, BLOCK_M), tl.float32)
    for k0 in range(k_begin, k_end, BLOCK_K):
        inside = depth < k_end - k0
        w = tl.load(w_ptrs, mask=row_ok[:, None] & inside[None, :], other=0.0)
        q = tl.load(q_ptr + q_offsets, mask=used[:, None] & inside[None, :], other=0.0)
        if SCALES == 2:
            acc += tl.dot(w, tl.trans(q)) * tl.load(s_rows + k0 // SCALE_COLS, mask=row_ok, other=0.0).to(
                tl.float32)[:, None]
        else:
            acc = tl.dot(w, tl.trans(q), acc)
        w_ptrs += BLOCK_K
        q_offsets += BLOCK_K
    if SCALES == 1:
        acc *= tl.load(s_rows, mask=row_ok, other=0.0).to(tl.float32)[:, None]
    return acc * tl.load(x_scale_ptr + rows, mask=used, other=0.0)[None, :]
