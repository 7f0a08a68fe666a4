"""A prefill chunk's FP8 dense product on FP8 tensor cores: x [T, in] @ dequant(weight [out, in]).T, x as two e4m3
terms.

Converting each FP8 weight to float16 in registers before the tensor cores (`_fp8_linear_kernel`) held q_proj at
T = 128 to 60 us against bf16 cuBLAS's 37 on the H200. Here nothing is converted in the product's loop: x is split
once per chunk (`split_activations`) into two e4m3 terms per token t,

    x[t] = s[t] * (hi[t] + lo[t] / LO_LIFT),   s[t] = max|x[t]| / 448,
    hi = e4m3(x / s),   lo = e4m3(LO_LIFT * (x / s - hi)),

and W @ x^T is two FP8 x FP8 tensor-core products of the stored weight, both operands straight from shared memory.
Each term keeps e4m3's 4 significant bits, the pair about 8 (bf16 keeps 8): hi's rounding error is at most half a
unit of its last place, 16 at the top of e4m3's range, so lo = 16 x that error stays inside 448. A per-channel weight
scale and s[t] multiply the float32 sums once; a block scale multiplies each step's sums (a step lies inside one
block column), the two terms joined first.

Needs FP8 tensor cores (sm_89 and newer; `fp8_linear_triton.run_fp8_linear` decides) and 16-bit x: float32 x keeps
the float32 products of the converting kernel.
"""

import torch
import triton
import triton.language as tl

from app.kernels.expert_tiles import DECODE_TOKENS, Tiles
from app.kernels.finish_shares_triton import finish_shares
from app.kernels.fp8_bytes import reads_fp8_as_bytes
from app.kernels.glu_experts_triton import Projection

LO_LIFT = tl.constexpr(16.0)  # lo's scale below hi's: hi's rounding error, at most 16 (half of e4m3's ulp at 256-448)
E4M3_MAX = tl.constexpr(448.0)
SPLIT_BLOCK = 1024  # inputs a split program reads a step
MIN_SPLIT_INPUTS = 2048  # inputs a split of a product reads at the least


def split_activations(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """x [T, in] bf16 / fp16 -> (hi [T, in] e4m3, lo [T, in] e4m3, s [T] float32), as the module docstring says."""
    tokens, inputs = x.shape
    hi = torch.empty((tokens, inputs), dtype=torch.float8_e4m3fn, device=x.device)
    lo = torch.empty_like(hi)
    scale = torch.empty(tokens, dtype=torch.float32, device=x.device)
    _split_kernel[(tokens,)](x, hi, lo, scale, inputs, BLOCK=SPLIT_BLOCK, num_warps=4)
    return hi, lo, scale


def prefill_tiles(tokens: int, out_features: int, in_features: int, sm_count: int) -> tuple[int, Tiles, int]:
    """(tokens a tile, weight tiles, split-K) for a chunk: 128 x 128 tiles (64 tokens for a chunk of 64 or fewer),
    then half the tokens a tile and splits of the inputs (MIN_SPLIT_INPUTS or more each) until the launch has a
    program for every SM (o_proj's 4096 rows are 32 row tiles)."""
    block_m, tiles, split = 128, Tiles(128, 128, warps=8, stages=4), 1

    def programs() -> int:
        return triton.cdiv(out_features, tiles.features) * triton.cdiv(tokens, block_m) * split

    if tokens <= 64 or programs() < sm_count:
        block_m = 64
    while programs() < sm_count and in_features >= 2 * split * MIN_SPLIT_INPUTS:
        split *= 2
    return block_m, tiles, split


def takes_fp8_products(x: torch.Tensor, projection: Projection) -> bool:
    """Whether x [T, in] @ `projection`'s weight runs here: a chunk past a verify block's tokens, 16-bit x, an FP8
    weight on a device with FP8 tensor cores (or in the interpreter)."""
    return (
        x.shape[0] > DECODE_TOKENS and x.dtype in (torch.bfloat16, torch.float16)
        and projection.weight.dtype == torch.float8_e4m3fn and not reads_fp8_as_bytes(x.device)
    )


def run_fp8_prefill(
    x: torch.Tensor,
    projection: Projection,
    glu: bool = False,
    residual: torch.Tensor | None = None,
    tiles: tuple[int, Tiles, int] | None = None,
) -> torch.Tensor:
    """x [T, in] @ dequant(projection's weight).T -> [T, out] in x's dtype, then `fp8_linear`'s epilogues; `tiles`
    (tokens a tile, weight tiles, split-K) overrides `prefill_tiles`."""
    tokens, inputs = x.shape
    out_features = projection.weight.shape[0]
    if tiles is None:
        sm_count = torch.cuda.get_device_properties(x.device).multi_processor_count if x.is_cuda else 132
        tiles = prefill_tiles(tokens, out_features, inputs, sm_count)
    block_m, weight_tiles, split = tiles
    step = projection.step(weight_tiles)
    per_split = triton.cdiv(triton.cdiv(inputs, step), split) * step  # whole steps, so whole block columns
    split = triton.cdiv(inputs, per_split)
    finish = split > 1 or glu or residual is not None
    out = torch.empty((split, tokens, out_features) if finish else (tokens, out_features),
                      dtype=torch.float32 if finish else x.dtype, device=x.device)
    hi, lo, token_scale = split_activations(x.contiguous())
    grid = (triton.cdiv(out_features, weight_tiles.features), triton.cdiv(tokens, block_m), split)
    _fp8_prefill_kernel[grid](
        hi, lo, token_scale, projection.weight, projection.scale, out, tokens, out_features, inputs, per_split,
        **projection.scale_constants(), BLOCK_M=block_m, BLOCK_N=weight_tiles.features, BLOCK_K=step,
        num_warps=weight_tiles.warps, num_stages=weight_tiles.stages,
    )
    return finish_shares(out, x.dtype, glu, residual) if finish else out


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
def _fp8_prefill_kernel(
    hi_ptr, lo_ptr, token_scale_ptr, weight_ptr, scale_ptr, out_ptr, tokens, n_size, k_size, k_per_split,
    SCALES: tl.constexpr, SCALE_ROWS: tl.constexpr, SCALE_COLS: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
):
    """Program (weight row tile, token tile, split): out[split, tokens, rows] = s[tokens] * W[rows, split's inputs] @
    (hi + lo / LO_LIFT)[tokens, split's inputs]^T (out is [tokens, rows] when there is one split)."""
    features = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    rows = tl.program_id(1) * BLOCK_M + tl.arange(0, BLOCK_M)  # token rows of x
    split = tl.program_id(2)
    row_ok, used = features < n_size, rows < tokens
    k_begin = split * k_per_split
    k_end = tl.minimum(k_begin + k_per_split, k_size)
    depth = tl.arange(0, BLOCK_K)
    w_ptrs = weight_ptr + features[:, None].to(tl.int64) * k_size + k_begin + depth[None, :]  # [BLOCK_N, BLOCK_K]
    x_offsets = rows[:, None].to(tl.int64) * k_size + k_begin + depth[None, :]  # [BLOCK_M, BLOCK_K]
    if SCALES == 2:
        s_rows = scale_ptr + (features // SCALE_ROWS) * tl.cdiv(k_size, SCALE_COLS)
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
    if SCALES == 1:
        channel_scale = tl.load(scale_ptr + features, mask=row_ok, other=0.0).to(tl.float32)
        acc = (acc + acc_lo * (1.0 / LO_LIFT)) * channel_scale[:, None]
    acc *= tl.load(token_scale_ptr + rows, mask=used, other=0.0)[None, :]
    out_ptrs = out_ptr + (split * tokens + rows[None, :]).to(tl.int64) * n_size + features[:, None]
    tl.store(out_ptrs, acc.to(out_ptr.dtype.element_ty), mask=used[None, :] & row_ok[:, None])
