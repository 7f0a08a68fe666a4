"""The Triton kernel of fp8_linear.py: x [T, in] @ dequant(weight [out, in]).T.

One token (decode) goes to `run_one_token`: rows times one vector on CUDA cores (rows_times_vector_triton.py),
a few rows a program (`one_token_tiles`), the epilogues in the same launch. More tokens get tiles by count
(`pick_tiles`), on GLM-4.5-Air's shapes (hidden 4096, q_proj 12288 × 4096, k/v 1024 × 4096, o_proj 4096 × 12288,
dense MLP 10944, shared expert 1408):
- 1 < T ≤ 16 (a verify block) is bound by reading the weight: 16 tokens × 32 weight rows × 128 inputs per
  step, and the inputs split over several programs (split-K) until there are about two programs per SM:
  k_proj's 1024 rows make 32 row tiles, too few for 132 SMs reading 4 MB. Split partial sums are float32
  [split, T, out] added by one more launch (finish_shares_triton.py), which also applies the epilogues (a launch
  without splits but with an epilogue writes one float32 share for it): deterministic, no atomics, a buffer of
  T × out floats per split.
- T > 16 (prefill chunks) is bound by compute. With 16-bit x on a GPU with FP8 tensor cores the same kernel takes
  x quantized once to e4m3 (a scale per token, as the checkpoints declare their activations) and multiplies it
  with the stored weight on FP8 tensor cores (fp8_products_triton.py), at 128 × 128 tiles, split over the inputs in
  two where those leave SMs idle (`prefill_tiles`). Float32 x and GPUs before sm_89 take 64 tokens × 128 rows ×
  64 inputs, no split, the weights converted in registers.
  Dequantizing to bf16 and calling cuBLAS instead would move 1 + 2 + 2 bytes per weight rather than 1 and needs a
  bf16 copy of the weight (96 MiB for o_proj) as workspace the plan does not hold.
"""

import math
from dataclasses import replace

import torch
import triton
import triton.language as tl

from app.kernels.dependent_launch import after_earlier_kernels_only, dependent_launch
from app.kernels.expert_tiles import DECODE_TOKENS, INTERPRETED, Tiles
from app.kernels.finish_shares_triton import finish_shares
from app.kernels.fp8_products_triton import fp8_products, input_terms, runs_fp8_products
from app.kernels.glu_experts_triton import (
    NO_SCALE,
    PER_BLOCK,
    PER_CHANNEL,
    Projection,
    _expert_matmul,
    _row_pointers,
    tile_inputs,
)
from app.kernels.rows_times_vector_triton import RowTiles, gated_rows_times_vector, rows_times_vector, weight_rows

PROGRAMS_PER_SM = 2
MIN_WARPS = 1024  # a single-token launch's warps at the least: about 8 an SM on the H200's 132, for 1-byte weights
MIN_STEPS_PER_SPLIT = 4  # a split reads at least 4 steps of inputs, so partial sums stay few
PREFILL_WEIGHT_TILES = Tiles(128, 128, warps=8, stages=4)  # a chunk's weight tiles on FP8 products (`prefill_tiles`)


def pick_tiles(tokens: int, out_features: int, in_features: int, sm_count: int) -> tuple[int, Tiles, int]:
    """(token side of a tile, weight tiles, split-K) for one launch; see the module docstring."""
    if tokens > DECODE_TOKENS:
        return 64, Tiles(128, 64, warps=8, stages=3), 1
    tiles = Tiles(32, 128, warps=4, stages=4)
    programs = math.ceil(out_features / tiles.features) * math.ceil(tokens / DECODE_TOKENS)
    steps = math.ceil(in_features / tiles.depth)
    split = min(math.ceil(PROGRAMS_PER_SM * sm_count / programs), max(steps // MIN_STEPS_PER_SPLIT, 1))
    return DECODE_TOKENS, tiles, max(split, 1)


def prefill_tiles(tokens: int, out_features: int, sm_count: int) -> tuple[int, Tiles, int]:
    """(tokens a tile, weight tiles, split-K) for a chunk on FP8 products, from the H100 sweeps at GLM-4.5-Air's
    shapes (bench/NOTES.md): 128 tokens × 128 rows × 128 inputs on 8 warps. Where that leaves fewer programs than
    half the SMs (o_proj's 4096 rows are 32 row tiles), the inputs split in two, and the tokens go 64 a tile where
    even the split leaves so few (o_proj, CUDA-graph times: 41.7 against 45.3 us per channel at 128 tokens, 69.3
    against 76.9 block-128 at 256)."""
    wide = triton.cdiv(out_features, PREFILL_WEIGHT_TILES.features) * triton.cdiv(tokens, 128)
    if wide >= sm_count // 2:
        return 128, PREFILL_WEIGHT_TILES, 1
    return (64 if 2 * wide < sm_count // 2 else 128), PREFILL_WEIGHT_TILES, 2


def run_fp8_linear(
    x: torch.Tensor,
    weight: torch.Tensor,
    scale: torch.Tensor,
    block: tuple[int, int] | None = None,
    tiles: tuple[int, Tiles, int] | None = None,
    glu: bool = False,
    residual: torch.Tensor | None = None,
    fp8_products: bool | None = None,
) -> torch.Tensor:
    """`fp8_linear`; `fp8_products` forces FP8 products (True) or the converting products (False), else they run
    where `runs_fp8_products`."""
    tokens, in_features = x.shape
    if tokens == 1 and tiles is None:
        return run_one_token(x, weight, scale, block, glu, residual)
    projection = _projection(weight, scale, block, in_features)
    out_features = weight.shape[0]
    fp8 = runs_fp8_products(x, weight) if fp8_products is None else fp8_products
    assert not fp8 or weight.dtype == torch.float8_e4m3fn, "FP8 products need an e4m3 weight"
    x = x.contiguous()
    if tiles is None:
        sm_count = torch.cuda.get_device_properties(x.device).multi_processor_count if x.is_cuda else 132
        tiles = (prefill_tiles(tokens, out_features, sm_count) if fp8
                 else pick_tiles(tokens, out_features, in_features, sm_count))
    block_m, weight_tiles, split = tiles
    dtype, half = x.dtype, x.dtype != torch.float32 and not fp8
    x_terms = input_terms(tile_inputs(x, projection, half), fp8)
    step = projection.step(weight_tiles)
    # each split reads whole steps: its inputs start at a multiple of the step (and so of no block column)
    steps = triton.cdiv(in_features, step)
    per_split = triton.cdiv(steps, split) * step
    split = triton.cdiv(in_features, per_split)
    finish = split > 1 or glu or residual is not None
    if finish:
        out = torch.empty((split, tokens, out_features), dtype=torch.float32, device=x.device)
    else:
        out = torch.empty((tokens, out_features), dtype=dtype, device=x.device)
    grid = (triton.cdiv(out_features, weight_tiles.features), triton.cdiv(tokens, block_m), split)
    _fp8_linear_kernel[grid](
        *x_terms, *projection.typed_pointers(), out, tokens, out_features, in_features, per_split,
        **projection.constants(half=half),
        F32_INPUTS=dtype == torch.float32, UPCAST=INTERPRETED, FP8=fp8,
        BLOCK_M=block_m, BLOCK_N=weight_tiles.features, BLOCK_K=step,
        num_warps=weight_tiles.warps, num_stages=weight_tiles.stages,
    )
    return finish_shares(out, dtype, glu, residual) if finish else out


def _projection(
    weight: torch.Tensor, scale: torch.Tensor | None, block: tuple[int, int] | None, in_features: int
) -> Projection:
    out_features = weight.shape[0]
    assert weight.shape == (out_features, in_features), weight.shape
    if scale is None:  # an unscaled bf16, fp16 or float32 weight (the one-token kernel only: `one_token_linear`)
        assert weight.dtype in (torch.bfloat16, torch.float16, torch.float32) and weight.is_contiguous()
        return Projection(weight, None, NO_SCALE)
    assert weight.dtype == torch.float8_e4m3fn, weight.dtype
    assert weight.is_contiguous() and scale.is_contiguous(), "an FP8 weight and its scale must be contiguous"
    if block is None:
        assert scale.shape == (out_features, 1), f"a per-channel scale is [out, 1], not {list(scale.shape)}"
        return Projection(weight, scale, PER_CHANNEL)
    assert block[1] % 16 == 0, "a step of 16 or more inputs must stay inside one block column"
    expected = (triton.cdiv(out_features, block[0]), triton.cdiv(in_features, block[1]))
    assert scale.shape == expected, f"block scales are {list(expected)}, not {list(scale.shape)}"
    return Projection(weight, scale, PER_BLOCK, block)


def one_token_tiles(in_features: int, glu: bool, element_size: int = 1, width: int | None = None) -> RowTiles:
    """The fastest tiles of the H200 sweep at GLM-4.5-Air's FP8 shapes (bench/NOTES.md): a GLU's gate and up rows on
    4 warps; else 8 rows folded by 16 up to 4096 inputs, 4 beyond (o_proj's 12288: the unrolled steps' registers).
    Wider weights (`element_size` bytes) take as many bytes a step (`RowTiles.for_element_size`). Fewer rows a
    program where `width` outputs would leave the launch fewer than MIN_WARPS warps a byte of weight: each warp
    holds only a few steps' loads in flight, so a launch of a few hundred (gpt-oss's o_proj, 2880 rows: 360 programs
    of 8) leaves the SMs waiting, and a row of wider weights is more bytes to wait for (gpt-oss's bf16 q/k/v on the
    H100: 1280 programs of 4 rows 12.8 us, 2560 of 2 rows 11.6)."""
    tiles = RowTiles(4, 512, warps=4) if glu else RowTiles(8 if in_features <= 4096 else 4, 512, fold=16)
    min_warps = MIN_WARPS * element_size
    while width is not None and tiles.rows > 1 and math.ceil(width / tiles.rows) * tiles.warps < min_warps:
        tiles = replace(tiles, rows=tiles.rows // 2)
    return tiles.for_element_size(element_size)


def run_one_token(
    x: torch.Tensor,
    weight: torch.Tensor,
    scale: torch.Tensor | None,
    block: tuple[int, int] | None = None,
    glu: bool = False,
    residual: torch.Tensor | None = None,
    tiles: RowTiles | None = None,
) -> torch.Tensor:
    """`fp8_linear` of x [1, in] in one launch (an unscaled weight where `scale` is None); `tiles` overrides
    `one_token_tiles`."""
    in_features = x.shape[1]
    projection = _projection(weight, scale, block, in_features)
    width = weight.shape[0] // 2 if glu else weight.shape[0]
    assert not glu or weight.shape[0] % 2 == 0, "gate rows then as many up rows"
    assert residual is None or (residual.shape == (1, width) and residual.dtype == x.dtype)
    tiles = projection.inside_scale_blocks(tiles or one_token_tiles(in_features, glu, weight.element_size(), width))
    if glu and projection.kind == PER_BLOCK:  # the up rows in one block row too
        tiles = tiles.within(width)
    out = torch.empty((1, width), dtype=x.dtype, device=x.device)
    _one_token_kernel[(triton.cdiv(width, tiles.rows),)](
        x.contiguous(), *projection.typed_pointers(), out if residual is None else residual.contiguous(), out,
        N=width, K=in_features,
        **projection.scale_constants(), GLU=glu, HAS_RESIDUAL=residual is not None, **tiles.constants(),
        **dependent_launch(x.device),
    )
    return out


@triton.jit
def _fp8_linear_kernel(
    x_ptr, x_scale_ptr, weight_ptr, scale_ptr, out_ptr, tokens, n_size, k_size, k_per_split,
    SCALES: tl.constexpr, SCALE_ROWS: tl.constexpr, SCALE_COLS: tl.constexpr,
    F32_INPUTS: tl.constexpr, UPCAST: tl.constexpr, HALF: tl.constexpr, FP8: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
):
    """Program (row tile, token tile, split): W[rows, split's inputs] @ x[tokens, split's inputs]^T into
    out[split, tokens, rows] (out is [tokens, rows] in x's dtype when there is one split). With FP8, x_ptr and
    x_scale_ptr are x quantized and its scales (fp8_products_triton.py); else the first is x."""
    features = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    rows = tl.program_id(1) * BLOCK_M + tl.arange(0, BLOCK_M)  # token rows of x
    split = tl.program_id(2)
    row_ok, used = features < n_size, rows < tokens
    w_rows, s_rows = _row_pointers(weight_ptr, scale_ptr, features, n_size, k_size, SCALES, SCALE_ROWS, SCALE_COLS)
    k_begin = split * k_per_split
    k_end = tl.minimum(k_begin + k_per_split, k_size)
    if FP8:
        acc = fp8_products(x_ptr, x_scale_ptr, rows, used, w_rows, s_rows, row_ok, k_begin, k_end, k_size,
                           SCALES, SCALE_COLS, BLOCK_M, BLOCK_N, BLOCK_K)
    else:
        acc = _expert_matmul(x_ptr, rows, used, w_rows, s_rows, row_ok, k_begin, k_end, k_size,
                             SCALES, SCALE_COLS, F32_INPUTS, UPCAST, HALF, BLOCK_M, BLOCK_N, BLOCK_K)
    out_ptrs = out_ptr + (split * tokens + rows[None, :]).to(tl.int64) * n_size + features[:, None]
    tl.store(out_ptrs, acc.to(out_ptr.dtype.element_ty), mask=used[None, :] & row_ok[:, None])


@triton.jit
def _one_token_kernel(
    x_ptr, weight_ptr, scale_ptr, residual_ptr, out_ptr, N: tl.constexpr, K: tl.constexpr,
    SCALES: tl.constexpr, SCALE_ROWS: tl.constexpr, SCALE_COLS: tl.constexpr,
    GLU: tl.constexpr, HAS_RESIDUAL: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, FOLD: tl.constexpr,
    WARPS: tl.constexpr, PDL: tl.constexpr,
):
    """Program: outputs [first, first + BLOCK_N) of one token; with GLU the rows' gate (rows) and up (rows + N)."""
    after_earlier_kernels_only(PDL)
    first = tl.program_id(0) * BLOCK_N
    features = first + tl.arange(0, BLOCK_N)
    rows = tl.minimum(features, N - 1)  # the last program's extra rows repeat the last one: no masked loads
    w_rows, scales = weight_rows(weight_ptr, scale_ptr, rows, first, K, SCALES, SCALE_ROWS, SCALE_COLS)
    if GLU:
        up_rows, up_scales = weight_rows(weight_ptr, scale_ptr, rows + N, first + N, K, SCALES, SCALE_ROWS, SCALE_COLS)
        y = gated_rows_times_vector(x_ptr, w_rows, scales, up_rows, up_scales, K, SCALES, SCALE_COLS, BLOCK_N, BLOCK_K,
                                    FOLD, WARPS)
    else:
        y = rows_times_vector(x_ptr, w_rows, scales, K, SCALES, SCALE_COLS, BLOCK_N, BLOCK_K, FOLD, WARPS)
    if HAS_RESIDUAL:
        y += tl.load(residual_ptr + features, mask=features < N).to(tl.float32)
    tl.store(out_ptr + features, y.to(out_ptr.dtype.element_ty), mask=features < N)
