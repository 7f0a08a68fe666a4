"""Triton kernels for SiLU-gated routed experts (GLM): one launch per projection for all tokens and picks.

Pairs (token, pick) are grouped into tiles that share an expert (expert_tiles.py), so each tile reads its
expert's weights once, from wherever its row of an address table points (expert_table.py: a cache slot, or
page-locked host memory in place), in the checkpoint's layout (rows are
output features: gate/up [S, W, H], down [S, H, W]). Weights are bf16 or FP8 e4m3, converted in
registers to the activations' dtype (FP8 with bf16 activations: to float16 by default, one instruction
per two weights instead of three per weight; e4m3 values are exact there). A per-channel scale [S, out, 1]
multiplies the products once in the epilogue; a block scale [S, ceil(out/b0), ceil(in/b1)] multiplies its
step's weights in registers (steps never straddle a block column), so that the products add up in the tensor
cores' accumulator. Weights are the M side of each product (out^T = W @ x^T), so the token side of a tile can be
as small as 16 at decode. A prefill chunk of FP8 experts with 16-bit activations where FP8 tensor cores are
(`LaunchConfig.fp8_products`) skips the conversion: x and the activations each quantized once to e4m3 (a scale per
row), FP8 x FP8 products of the stored weights (fp8_products_triton.py).

- gate_up: a tile's rows are gate rows and the same features' up rows, read in one loop and one
  product; SiLU(gate) * up in the epilogue -> activations [P, W], in sorted order.
- down: routing weight in the epilogue -> one float32 row per pick [P, H].
- `sum_picks` adds each token's picks in pick order (deterministic, no atomics).
"""

import math
from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from app.kernels.expert_table import columns, row_pointer, slot_table
from app.kernels.expert_tiles import (
    DECODE_TOKENS,
    INTERPRETED,
    MAX_PAIRS,
    LaunchConfig,
    Tiles,
    plan_tiles,
    store_activations,
    sum_picks,
    tile_rows,
)
from app.kernels.fp8_bytes import for_kernels, weights_as
from app.kernels.fp8_products_triton import fp8_products, input_terms, runs_fp8_products
from app.kernels.glu_experts import runs_one_token
from app.kernels.glu_experts_one_token import run_one_token
from app.kernels.rows_times_vector_triton import RowTiles
from app.quantization import BLOCK_SCALE, PER_CHANNEL_SCALE

NO_SCALE, PER_CHANNEL, PER_BLOCK = 0, 1, 2  # the SCALES constexpr
# block scales times 2^8 go into the weights, and the sums times 2^-8 come out (exact powers of two): in float16 a
# scale under 2^-14 (a block whose weights all stay under 2^-14 * 448, about 0.027) keeps fewer bits, the
# fewer the smaller (products off by 3.5e-3 at scales of 4.5e-6, 3.5e-2 at 4.6e-7); lifted, that starts under
# 2^-22, and a weight may still reach 65504 / 2^8, beyond any real checkpoint's
SCALE_LIFT = tl.constexpr(256.0)


def pick_config(num_pairs: int) -> LaunchConfig:
    pairs_per_tile = 16 if num_pairs <= 256 else 32
    return LaunchConfig(pairs_per_tile, Tiles(64, 128), Tiles(64, 128), fp16_products=True, fp8_products=True)


@dataclass(frozen=True)
class Projection:
    """One projection's arenas: weight [S, out, in], its FP8 scale (or None) and how the scale is laid out."""

    weight: torch.Tensor
    scale: torch.Tensor | None
    kind: int  # NO_SCALE, PER_CHANNEL or PER_BLOCK
    block: tuple[int, int] = (1, 1)  # PER_BLOCK: rows × columns one scale covers

    @classmethod
    def of(cls, arenas: dict[str, torch.Tensor], name: str, fp8_block: tuple[int, int] | None) -> "Projection":
        weight = arenas[f"{name}.weight"]
        if f"{name}.{PER_CHANNEL_SCALE}" in arenas:
            return cls(weight, arenas[f"{name}.{PER_CHANNEL_SCALE}"], PER_CHANNEL)
        if f"{name}.{BLOCK_SCALE}" in arenas:
            assert fp8_block is not None, "block scales need the checkpoint's weight_block_size"
            assert fp8_block[1] % 16 == 0, "a step of 16 or more inputs must stay inside one block column"
            return cls(weight, arenas[f"{name}.{BLOCK_SCALE}"], PER_BLOCK, fp8_block)
        assert weight.dtype in (torch.bfloat16, torch.float16, torch.float32), f"{name} is {weight.dtype} unscaled"
        return cls(weight, None, NO_SCALE)

    def step(self, tiles: Tiles) -> int:
        """Inputs per loop step: a block scale's columns split into whole steps."""
        return math.gcd(tiles.depth, self.block[1]) if self.kind == PER_BLOCK else tiles.depth

    def inside_scale_blocks(self, tiles: RowTiles) -> RowTiles:
        """`tiles` with a program's rows inside one block row of scales (rows_times_vector_triton.py)."""
        return tiles.within(self.block[0]) if self.kind == PER_BLOCK else tiles

    def typed_pointers(self) -> tuple[torch.Tensor, torch.Tensor]:
        """Tensors whose pointers give the kernel the weight's and the scale's dtypes (FP8 weights' bytes where
        Triton has no float8e4nv: fp8_bytes.py)."""
        weight = for_kernels(self.weight)
        return weight, weight if self.scale is None else self.scale

    def table_columns(self, names: tuple[str, ...], name: str) -> tuple[int, int]:
        """The table's columns of the weight and its scale (the weight's own when unscaled)."""
        weight = names.index(f"{name}.weight")
        scale = {NO_SCALE: None, PER_CHANNEL: PER_CHANNEL_SCALE, PER_BLOCK: BLOCK_SCALE}[self.kind]
        return weight, weight if scale is None else names.index(f"{name}.{scale}")

    def float16_products(self, half: bool) -> bool:
        """`half`: float16 products, for FP8 weights only (every e4m3 value is exact in float16; times its block's
        scale, lifted by SCALE_LIFT, it is rounded to float16)."""
        return half and self.kind != NO_SCALE

    def constants(self, half: bool) -> dict:
        return self.scale_constants() | dict(HALF=self.float16_products(half))

    def scale_constants(self) -> dict:
        return dict(SCALES=self.kind, SCALE_ROWS=self.block[0], SCALE_COLS=self.block[1])


def run_experts(
    hidden: torch.Tensor,
    arenas: dict[str, torch.Tensor],
    slots: torch.Tensor,
    weights: torch.Tensor,
    fp8_block: tuple[int, int] | None = None,
    config: LaunchConfig | None = None,
    shared: torch.Tensor | None = None,
) -> torch.Tensor:
    """hidden [T, H], slots [T, k] (-1: skip), weights [T, k] -> weighted expert sum [T, H]; `shared`: see
    `run_from_table`."""
    return run_from_table(hidden, arenas, slot_table(arenas), slots, weights, fp8_block, config, shared)


def run_from_table(
    hidden: torch.Tensor,
    arenas: dict[str, torch.Tensor],
    table: torch.Tensor,
    rows: torch.Tensor,
    weights: torch.Tensor,
    fp8_block: tuple[int, int] | None = None,
    config: LaunchConfig | None = None,
    shared: torch.Tensor | None = None,
) -> torch.Tensor:
    """`run_experts` reading each expert where its row of the address table [R, C] points: rows [T, k] (-1:
    skip). The arenas give the tensors' names, shapes and dtypes (the table's columns). `shared` [1, C], the row of
    an expert added at weight 1 (expert_table.address_row), where `runs_one_token`."""
    tokens, picks = rows.shape
    assert shared is None or (config is None and runs_one_token(tokens, arenas)), \
        "a shared expert runs as a pick of the one-token kernels only (runs_one_token)"
    chunk = max(1, MAX_PAIRS // picks)
    if tokens > chunk:
        parts = (slice(i, i + chunk) for i in range(0, tokens, chunk))
        return torch.cat([run_from_table(hidden[p], arenas, table, rows[p], weights[p], fp8_block, config)
                          for p in parts])
    assert hidden.dim() == 2 and hidden.shape[0] == tokens and weights.shape == rows.shape
    assert all(t.is_contiguous() for t in arenas.values()), "expert arenas must be contiguous"
    hidden, rows, weights = hidden.contiguous(), rows.contiguous(), weights.contiguous()
    gate, up, down = (Projection.of(arenas, name, fp8_block) for name in ("gate_proj", "up_proj", "down_proj"))
    assert gate.kind == up.kind and gate.block == up.block, "gate_proj and up_proj must share one format"
    assert gate.weight.dtype == up.weight.dtype, "gate_proj and up_proj must share one dtype"
    num_slots, width, hidden_size = gate.weight.shape
    assert hidden.shape[1] == hidden_size and down.weight.shape == (num_slots, hidden_size, width)
    names = columns(arenas)

    if config is None and runs_one_token(tokens, arenas):
        return run_one_token(hidden, (gate, up, down), table, rows, weights, names, shared=shared)
    config = config or pick_config(rows.numel())
    num_pairs, device = rows.numel(), hidden.device
    plan = plan_tiles(rows, table.shape[0], config.pairs_per_tile)
    tiles_in = (plan.sorted_pairs, plan.sorted_slots, plan.tile_starts, plan.tile_count)
    shared = dict(F32_INPUTS=hidden.dtype == torch.float32, UPCAST=INTERPRETED, BLOCK_M=config.pairs_per_tile,
                  COLUMNS=len(names))
    fp8 = config.fp8_products and runs_fp8_products(hidden, gate.weight)
    half = config.fp16_products and hidden.dtype != torch.float32 and not fp8
    inputs = tile_inputs(hidden, gate, half)  # float16 inputs come with float16 activations
    x_terms = input_terms(inputs, fp8)

    activations = torch.empty((num_pairs, width), dtype=inputs.dtype, device=device)
    tiles = config.gate_up
    _gate_up_kernel[(plan.max_tiles, triton.cdiv(width, tiles.features // 2))](
        *x_terms, *gate.typed_pointers(), table, *tiles_in, activations, hidden_size, width, picks,
        *gate.table_columns(names, "gate_proj"), *up.table_columns(names, "up_proj"),
        **shared, **gate.constants(half), FP8=fp8, BLOCK_N=tiles.features, BLOCK_K=gate.step(tiles),
        ELEMENT_BYTES=gate.weight.element_size(), num_warps=tiles.warps, num_stages=tiles.stages,
    )
    activation_terms = input_terms(activations, fp8)
    per_pick = torch.empty((num_pairs, hidden_size), dtype=torch.float32, device=device)
    tiles = config.down
    _down_kernel[(plan.max_tiles, triton.cdiv(hidden_size, tiles.features))](
        *activation_terms, *down.typed_pointers(), table, weights, *tiles_in, per_pick, hidden_size, width,
        *down.table_columns(names, "down_proj"),
        **shared, **down.constants(half), FP8=fp8, BLOCK_N=tiles.features, BLOCK_K=down.step(tiles),
        num_warps=tiles.warps, num_stages=tiles.stages,
    )
    return sum_picks(per_pick, rows, hidden.dtype)


def tile_inputs(x: torch.Tensor, projection: Projection, half: bool) -> torch.Tensor:
    """x [T, in] as `_expert_matmul` takes it for `projection`'s tiles: where they multiply an FP8 weight in float16
    (`half`) and a prefill chunk's bf16 x (more than DECODE_TOKENS tokens: a verify block keeps its launches and
    converts in the loop), x as float16 saturated at its largest finite value, converted once. x then goes from
    shared memory straight to the tensor cores (sm_90: converted in the loop, each step's x went back through shared
    memory and every step waited for its products)."""
    if projection.float16_products(half) and x.dtype == torch.bfloat16 and x.shape[0] > DECODE_TOKENS:
        return torch.clamp(x.to(torch.float16), -65504.0, 65504.0)
    return x


@triton.jit
def _row_pointers(
    weight_ptr, scale_ptr, features, n_size, k_size,
    SCALES: tl.constexpr, SCALE_ROWS: tl.constexpr, SCALE_COLS: tl.constexpr,
):
    """Per row of a tile: where W[feature, :] of one expert starts and where its scales start (its per-channel
    scale or its row of block scales; the weight's own pointer when unscaled). `weight_ptr` / `scale_ptr` may
    differ per row (gate rows and up rows in one tile)."""
    w_rows = weight_ptr + features * k_size
    if SCALES == 1:
        s_rows = scale_ptr + features
    elif SCALES == 2:
        s_rows = scale_ptr + (features // SCALE_ROWS) * tl.cdiv(k_size, SCALE_COLS)
    else:
        s_rows = w_rows
    return w_rows, s_rows


@triton.jit
def _expert_matmul(
    x_ptr, rows, used, w_rows, s_rows, row_ok, k_begin, k_end, k_size,
    SCALES: tl.constexpr, SCALE_COLS: tl.constexpr,
    F32_INPUTS: tl.constexpr, UPCAST: tl.constexpr, HALF: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
):
    """W[:, k_begin:k_end] @ x[rows, k_begin:k_end]^T -> [BLOCK_N, BLOCK_M] float32 (unused rows give 0) for the
    weight rows of `_row_pointers`, scaled as SCALES says; x rows are k_size long."""
    depth = tl.arange(0, BLOCK_K)
    x_ptrs = x_ptr + rows[None, :].to(tl.int64) * k_size + k_begin + depth[:, None]  # [BLOCK_K, BLOCK_M]
    w_ptrs = w_rows[:, None] + k_begin + depth[None, :]  # [BLOCK_N, BLOCK_K]
    acc = tl.zeros((BLOCK_N, BLOCK_M), tl.float32)
    for k0 in range(k_begin, k_end, BLOCK_K):
        x = tl.load(x_ptrs, mask=used[None, :] & (depth[:, None] < k_end - k0), other=0.0)
        w = tl.load(w_ptrs, mask=row_ok[:, None] & (depth[None, :] < k_end - k0), other=0.0)
        if UPCAST and not HALF:  # the interpreter's bf16 dot is wrong; its float16 one is right, so that runs there
            w, x = weights_as(w, tl.float32), x.to(tl.float32)
        elif HALF and x.dtype != tl.float16:  # `tile_inputs` spares the loop this; f16 x saturates
            x = tl.clamp(x.to(tl.float32), -65504.0, 65504.0).to(tl.float16)
        w = weights_as(w, x.dtype)  # e4m3 -> f16 is one instruction per pair, -> bf16 one more per weight
        if SCALES == 2:
            # the step's block scale goes into its weights, not its products: the products then add up in the
            # tensor cores' accumulator, and a step does not wait for its own products before the next
            scale = tl.load(s_rows + k0 // SCALE_COLS, mask=row_ok, other=0.0).to(tl.float32) * SCALE_LIFT
            w = w * scale.to(w.dtype)[:, None]
        # float32 x: tf32x3 gives about float32 products; "tf32" is Triton's default, a no-op for bf16
        acc = tl.dot(w, x, acc, input_precision="tf32x3" if F32_INPUTS else "tf32")
        w_ptrs += BLOCK_K
        x_ptrs += BLOCK_K
    if SCALES == 1:
        acc *= tl.load(s_rows, mask=row_ok, other=0.0).to(tl.float32)[:, None]
    elif SCALES == 2:
        acc *= 1.0 / SCALE_LIFT
    return acc


@triton.jit
def _gate_and_up(table_ptr, row, gate_column, gate_scale_column, up_column, up_scale_column, is_up,
                 gate_ptr, gate_scale_ptr, COLUMNS: tl.constexpr, SCALES: tl.constexpr, ELEMENT_BYTES: tl.constexpr):
    """Per tile row, the start of the expert's gate weights (the first BLOCK_N / 2 rows) or up weights (the
    others), and of their scales, from one row of an address table."""
    gate = row_pointer(table_ptr, row, gate_column, COLUMNS, gate_ptr)
    up_offset = tl.load(table_ptr + row * COLUMNS + up_column) - tl.load(table_ptr + row * COLUMNS + gate_column)
    # up rows as an element offset from the gate weights (times 0 or 1, not tl.where, which hides the rows'
    # alignment): Triton then loads them 16 bytes at a time, asynchronously
    weights = tl.multiple_of(gate + is_up.to(tl.int64) * (up_offset // ELEMENT_BYTES), 16)
    if SCALES == 0:
        scales = weights
    else:
        gate_scales = row_pointer(table_ptr, row, gate_scale_column, COLUMNS, gate_scale_ptr)
        up_scales = row_pointer(table_ptr, row, up_scale_column, COLUMNS, gate_scale_ptr)
        scales = tl.where(is_up, up_scales, gate_scales)
    return weights, scales


@triton.jit
def _gate_up_kernel(
    hidden_ptr, hidden_scale_ptr, gate_ptr, gate_scale_ptr, table_ptr,
    sorted_pairs_ptr, sorted_slots_ptr, tile_starts_ptr, tile_count_ptr, activations_ptr, hidden_size, width, picks,
    gate_column, gate_scale_column, up_column, up_scale_column,
    SCALES: tl.constexpr, SCALE_ROWS: tl.constexpr, SCALE_COLS: tl.constexpr,
    F32_INPUTS: tl.constexpr, UPCAST: tl.constexpr, HALF: tl.constexpr, FP8: tl.constexpr, COLUMNS: tl.constexpr,
    ELEMENT_BYTES: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
):
    """A tile's rows are BLOCK_N / 2 gate rows, then the same features' up rows: one product reads both. With FP8,
    hidden_ptr and hidden_scale_ptr are x quantized and its scales (fp8_products_triton.py); else the first is x."""
    if tl.program_id(0) >= tl.load(tile_count_ptr):
        return
    positions, row, used = tile_rows(tile_starts_ptr, sorted_slots_ptr, BLOCK_M)
    tokens = tl.load(sorted_pairs_ptr + positions, mask=used, other=0) // picks
    lane = tl.arange(0, BLOCK_N)
    is_up = lane >= BLOCK_N // 2
    features = tl.program_id(1) * (BLOCK_N // 2) + lane % (BLOCK_N // 2)
    weight_ptr, scale_ptr = _gate_and_up(table_ptr, row, gate_column, gate_scale_column, up_column, up_scale_column,
                                         is_up, gate_ptr, gate_scale_ptr, COLUMNS, SCALES, ELEMENT_BYTES)
    w_rows, s_rows = _row_pointers(weight_ptr, scale_ptr, features, width, hidden_size, SCALES, SCALE_ROWS, SCALE_COLS)
    if FP8:
        acc = fp8_products(hidden_ptr, hidden_scale_ptr, tokens, used, w_rows, s_rows, features < width, 0,
                           hidden_size, hidden_size, SCALES, SCALE_COLS, BLOCK_M, BLOCK_N, BLOCK_K)
    else:
        acc = _expert_matmul(
            hidden_ptr, tokens, used, w_rows, s_rows, features < width, 0, hidden_size, hidden_size,
            SCALES, SCALE_COLS, F32_INPUTS, UPCAST, HALF, BLOCK_M, BLOCK_N, BLOCK_K,
        )
    # [BLOCK_N, M] -> [2, BLOCK_N / 2, M] -> [BLOCK_N / 2, M, 2]
    gate, up = tl.split(tl.permute(tl.reshape(acc, (2, BLOCK_N // 2, BLOCK_M)), (1, 2, 0)))
    activation = gate * tl.sigmoid(gate) * up
    if activations_ptr.dtype.element_ty == tl.float16:
        activation = tl.clamp(activation, -65504.0, 65504.0)
    store_activations(activations_ptr, activation, positions, used, width, BLOCK_N // 2)


@triton.jit
def _down_kernel(
    activations_ptr, activation_scale_ptr, weight_ptr, scale_ptr, table_ptr, routing_ptr,
    sorted_pairs_ptr, sorted_slots_ptr, tile_starts_ptr, tile_count_ptr, per_pick_ptr, hidden_size, width,
    weight_column, scale_column,
    SCALES: tl.constexpr, SCALE_ROWS: tl.constexpr, SCALE_COLS: tl.constexpr,
    F32_INPUTS: tl.constexpr, UPCAST: tl.constexpr, HALF: tl.constexpr, FP8: tl.constexpr, COLUMNS: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
):
    """With FP8, activations_ptr and activation_scale_ptr are the activations quantized and their scales."""
    if tl.program_id(0) >= tl.load(tile_count_ptr):
        return
    positions, row, used = tile_rows(tile_starts_ptr, sorted_slots_ptr, BLOCK_M)
    pairs = tl.load(sorted_pairs_ptr + positions, mask=used, other=0)
    features = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    weights = row_pointer(table_ptr, row, weight_column, COLUMNS, weight_ptr)
    scales = row_pointer(table_ptr, row, scale_column, COLUMNS, scale_ptr)
    w_rows, s_rows = _row_pointers(weights, scales, features, hidden_size, width, SCALES, SCALE_ROWS, SCALE_COLS)
    if FP8:
        acc = fp8_products(activations_ptr, activation_scale_ptr, positions, used, w_rows, s_rows,
                           features < hidden_size, 0, width, width, SCALES, SCALE_COLS, BLOCK_M, BLOCK_N, BLOCK_K)
    else:
        acc = _expert_matmul(
            activations_ptr, positions, used, w_rows, s_rows, features < hidden_size, 0, width, width,
            SCALES, SCALE_COLS, F32_INPUTS, UPCAST, HALF, BLOCK_M, BLOCK_N, BLOCK_K,
        )
    routing = tl.load(routing_ptr + pairs, mask=used, other=0.0)
    tl.store(
        per_pick_ptr + pairs[None, :] * hidden_size + features[:, None], acc * routing.to(tl.float32)[None, :],
        mask=used[None, :] & (features[:, None] < hidden_size),
    )
