"""SiLU-gated routed experts (GLM) for one token's picks (the decode step): rows times one vector on CUDA cores
(rows_times_vector_triton.py), weights converted in registers. glu_experts_triton.py sends one token's experts here,
FP8 (either scale layout) or 16-bit.

One program per pick and block of output rows, so every weight of a pick's expert is read once by one program; a
pick reads its expert where its row of the address table (expert_table.py) points, and a skipped pick's programs
return at once. No tile plan: one token's picks are distinct experts, so there is nothing to group.

- gate_up: a program's gate rows and the same features' up rows, SiLU(gate) * up -> activations [k (+ 1), W].
- down: routing weight in the epilogue -> one float32 row per pick [k (+ 1), H], which `sum_picks` adds.

An expert every token takes at weight 1 (GLM's shared expert, in the routed experts' format) can run as one more
pick, from its own table row: its products then cost no launches of their own.
"""

import torch
import triton
import triton.language as tl

from app.kernels.dependent_launch import after_earlier_kernels, dependent_launch
from app.kernels.expert_table import row_or_own_pointer
from app.kernels.expert_tiles import sum_picks
from app.kernels.fp8_bytes import goes_as_bytes
from app.kernels.rows_times_vector_triton import RowTiles, gated_rows_times_vector, rows_times_vector, weight_rows

# the H200 sweep's fastest over both scale layouts at GLM-4.5-Air's FP8 shapes (bench/NOTES.md)
GATE_UP, DOWN = RowTiles(8, 1024, warps=2, fold=16), RowTiles(8, 512, warps=2, fold=16)
# where the weights go as e4m3 bytes (fp8_bytes.py), gate_up programs of 4 or more rows folded by 16 ran 2-4x slower
# than unfolded ones on the H200 (the bytes forced there, bench/NOTES.md); these were the fastest
GATE_UP_FROM_BYTES = RowTiles(4, 512, warps=2)


def default_tiles(weight: torch.Tensor) -> tuple[RowTiles, RowTiles]:
    """GATE_UP and DOWN for the experts' `weight`: as many bytes a step for wider weights; GATE_UP_FROM_BYTES where
    the kernels take FP8 weights as bytes."""
    if goes_as_bytes(weight):
        return GATE_UP_FROM_BYTES, DOWN
    return GATE_UP.for_element_size(weight.element_size()), DOWN.for_element_size(weight.element_size())


def run_one_token(
    hidden: torch.Tensor,
    projections: tuple,
    table: torch.Tensor,
    rows: torch.Tensor,
    weights: torch.Tensor,
    names: tuple[str, ...],
    tiles: tuple[RowTiles, RowTiles] | None = None,
    shared: torch.Tensor | None = None,
) -> torch.Tensor:
    """hidden [1, H], `projections` (gate, up, down: glu_experts_triton.Projection), rows [1, k] of the address table
    [R, C] (-1: skip), weights [1, k] -> [1, H]. `names` are the table's columns; `shared` [1, C], the table row of
    an expert added at weight 1 (expert_table.address_row); `tiles` (gate_up, down) override `default_tiles`."""
    gate, up, down = projections
    tiles = tiles or default_tiles(gate.weight)
    picks = rows.numel()
    programs = picks + (shared is not None)  # pick k, the last, is the shared expert
    own = table if shared is None else shared  # read by pick k alone
    width, hidden_size = gate.weight.shape[1:]
    activations = torch.empty((programs, width), dtype=hidden.dtype, device=hidden.device)
    gate_up, down_tiles = gate.inside_scale_blocks(tiles[0]), down.inside_scale_blocks(tiles[1])
    _gate_up_kernel[(programs, triton.cdiv(width, gate_up.rows))](
        hidden, *gate.typed_pointers(), table, rows, own, activations,
        *gate.table_columns(names, "gate_proj"), *up.table_columns(names, "up_proj"),
        H=hidden_size, W=width, PICKS=picks, COLUMNS=len(names), **gate.scale_constants(), **gate_up.constants(),
        **dependent_launch(hidden.device),
    )
    per_pick = torch.empty((programs, hidden_size), dtype=torch.float32, device=hidden.device)
    _down_kernel[(programs, triton.cdiv(hidden_size, down_tiles.rows))](
        activations, *down.typed_pointers(), table, rows, own, weights, per_pick,
        *down.table_columns(names, "down_proj"),
        H=hidden_size, W=width, PICKS=picks, COLUMNS=len(names), **down.scale_constants(), **down_tiles.constants(),
        **dependent_launch(hidden.device),
    )
    return sum_picks(per_pick, rows, hidden.dtype, always=programs - picks)


@triton.jit
def _pick_row(rows_ptr, pick, PICKS: tl.constexpr):
    """The table row of a program's pick (-1: skipped), and whether the pick is the shared expert (row 0 then)."""
    shared = pick == PICKS
    row = tl.load(rows_ptr + tl.minimum(pick, PICKS - 1)).to(tl.int64)  # int64: row * expert size passes 2^31
    return tl.where(shared, 0, row), shared


@triton.jit
def _expert_rows(table_ptr, row, own_ptr, shared, weight_column, scale_column, weight_ptr, scale_ptr, features, first,
                 N: tl.constexpr, K: tl.constexpr, COLUMNS: tl.constexpr,
                 SCALES: tl.constexpr, SCALE_ROWS: tl.constexpr, SCALE_COLS: tl.constexpr):
    """`weight_rows` of `features` of the expert in row `row` of the address table (the shared one's own row where
    `shared`)."""
    rows = tl.minimum(features, N - 1)  # the last program's extra rows repeat the last one: no masked loads
    weights = row_or_own_pointer(table_ptr, row, own_ptr, shared, weight_column, COLUMNS, weight_ptr)
    scales = row_or_own_pointer(table_ptr, row, own_ptr, shared, scale_column, COLUMNS, scale_ptr)
    return weight_rows(weights, scales, rows, first, K, SCALES, SCALE_ROWS, SCALE_COLS)


@triton.jit
def _gate_up_kernel(
    hidden_ptr, weight_ptr, scale_ptr, table_ptr, rows_ptr, own_ptr, activations_ptr,
    gate_column, gate_scale_column, up_column, up_scale_column,
    H: tl.constexpr, W: tl.constexpr, PICKS: tl.constexpr, COLUMNS: tl.constexpr,
    SCALES: tl.constexpr, SCALE_ROWS: tl.constexpr, SCALE_COLS: tl.constexpr,
    BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, FOLD: tl.constexpr,
    WARPS: tl.constexpr, PDL: tl.constexpr,
):
    after_earlier_kernels(PDL)
    pick = tl.program_id(0)
    row, shared = _pick_row(rows_ptr, pick, PICKS)
    if row < 0:
        return
    first = tl.program_id(1) * BLOCK_N
    features = first + tl.arange(0, BLOCK_N)
    gate_rows, gate_scales = _expert_rows(table_ptr, row, own_ptr, shared, gate_column, gate_scale_column, weight_ptr,
                                          scale_ptr, features, first, W, H, COLUMNS, SCALES, SCALE_ROWS, SCALE_COLS)
    up_rows, up_scales = _expert_rows(table_ptr, row, own_ptr, shared, up_column, up_scale_column, weight_ptr,
                                      scale_ptr, features, first, W, H, COLUMNS, SCALES, SCALE_ROWS, SCALE_COLS)
    activation = gated_rows_times_vector(hidden_ptr, gate_rows, gate_scales, up_rows, up_scales, H, SCALES, SCALE_COLS,
                                         BLOCK_N, BLOCK_K, FOLD, WARPS)
    tl.store(activations_ptr + pick * W + features, activation.to(activations_ptr.dtype.element_ty),
             mask=features < W)


@triton.jit
def _down_kernel(
    activations_ptr, weight_ptr, scale_ptr, table_ptr, rows_ptr, own_ptr, routing_ptr, per_pick_ptr,
    weight_column, scale_column,
    H: tl.constexpr, W: tl.constexpr, PICKS: tl.constexpr, COLUMNS: tl.constexpr,
    SCALES: tl.constexpr, SCALE_ROWS: tl.constexpr, SCALE_COLS: tl.constexpr,
    BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, FOLD: tl.constexpr,
    WARPS: tl.constexpr, PDL: tl.constexpr,
):
    after_earlier_kernels(PDL)
    pick = tl.program_id(0)
    row, shared = _pick_row(rows_ptr, pick, PICKS)
    if row < 0:
        return
    first = tl.program_id(1) * BLOCK_N
    features = first + tl.arange(0, BLOCK_N)
    w_rows, scales = _expert_rows(table_ptr, row, own_ptr, shared, weight_column, scale_column, weight_ptr, scale_ptr,
                                  features, first, H, W, COLUMNS, SCALES, SCALE_ROWS, SCALE_COLS)
    acc = rows_times_vector(activations_ptr + pick * W, w_rows, scales, W, SCALES, SCALE_COLS, BLOCK_N, BLOCK_K, FOLD,
                            WARPS)
    routing = tl.load(routing_ptr + tl.minimum(pick, PICKS - 1)).to(tl.float32)
    acc = acc * tl.where(shared, 1.0, routing)
    tl.store(per_pick_ptr + pick * H + features, acc, mask=features < H)
