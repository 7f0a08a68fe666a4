"""GPT-OSS routed experts for a few (token, pick) pairs with bf16 activations (the decode step), MXFP4 products in
float16 pairs (mxfp4_half_pairs.py).

One program per pair and block of output rows, so every weight of a pair's expert is read once by one program; a
pair reads its expert where its row of the address table (expert_table.py) points, or without a table in that slot of
the arenas (one dependent read fewer before the weights), and a skipped pick's programs return at once. No tile
plan: at one pair per program there is nothing to group.

- gate_up: biases and the clamped SwiGLU in the epilogue -> activations [P, W] times 2^shift, in pair order.
- down: bias and routing weight in the epilogue -> one float32 row per pick [P, H], which `sum_picks` adds, or
  the norm after the op where the norm before gave its inputs (pick_rows.py).
"""

import torch
import triton
import triton.language as tl

from app.kernels.dependent_launch import after_earlier_kernels_only, dependent_launch
from app.kernels.expert_table import row_pointer
from app.kernels.expert_tiles import Tiles, sum_picks
from app.kernels.mxfp4_half_pairs import (
    LARGEST_INPUT_EXPONENT,
    activation_shift,
    half_pairs,
    mxfp4_rows_times_half_pairs,
    pair_order,
)
from app.kernels.pick_rows import PickRows


def run_in_half_pairs(
    hidden: torch.Tensor,
    arenas: dict[str, torch.Tensor],
    table: torch.Tensor | None,
    rows: torch.Tensor,
    weights: torch.Tensor,
    limit: float,
    alpha: float,
    columns: tuple[str, ...],
    tiles: tuple[Tiles, Tiles],
    hidden_pairs: tuple[torch.Tensor, torch.Tensor] | None = None,
) -> torch.Tensor | PickRows:
    """hidden [T, H] bf16, rows [T, k] of the address table [R, C] (-1: skip), weights [T, k] -> [T, H]. `columns`
    names the table's columns; `tiles` gives each projection's rows per program and warps. With no table the rows
    are the arenas' slots. `hidden_pairs`, `half_pairs(hidden)` where the norm that made hidden gave it too; then
    the picks' rows unsummed, for the norm after to add (pick_rows.py)."""
    assert hidden.shape[1] % 32 == 0, "MXFP4 groups are 32 wide"
    x, x_unscale = half_pairs(hidden) if hidden_pairs is None else hidden_pairs
    activations = gate_up_in_half_pairs(x, x_unscale, arenas, table, rows, limit, alpha, columns, tiles[0])
    per_pick = down_in_half_pairs(activations, arenas, table, rows, weights, limit, columns, tiles[1])
    return sum_picks(per_pick, rows, hidden.dtype) if hidden_pairs is None else PickRows(per_pick, rows)


def gate_up_in_half_pairs(
    x: torch.Tensor, x_unscale: torch.Tensor, arenas: dict[str, torch.Tensor], table: torch.Tensor | None,
    rows: torch.Tensor, limit: float, alpha: float, columns: tuple[str, ...], tiles: Tiles,
) -> torch.Tensor:
    """The hidden states in float16 pairs (`half_pairs`: x [T, H], x_unscale [T]) -> each pair's activations
    [T * k, W] float16, in pair order and scaled for `down_in_half_pairs`."""
    hidden_size, width = x.shape[1], arenas["gate_up_proj_bias"].shape[1] // 2
    assert width % 32 == 0, "MXFP4 groups are 32 wide"
    num_pairs = rows.numel()
    gate_up_columns = [columns.index(f"gate_up_proj_{part}") for part in ("blocks", "scales", "bias")]
    activations = torch.empty((num_pairs, width), dtype=torch.float16, device=x.device)
    _half_pairs_gate_up_kernel[(num_pairs, triton.cdiv(2 * width, tiles.features))](
        x, x_unscale, arenas["gate_up_proj_blocks"].view(torch.int32), arenas["gate_up_proj_scales"],
        arenas["gate_up_proj_bias"], table, rows, activations, limit, alpha, *gate_up_columns,
        H=hidden_size, W=width, PICKS=rows.shape[1], COLUMNS=len(columns), ACT_SCALE=2.0 ** activation_shift(limit),
        BLOCK_N=tiles.features, num_warps=tiles.warps, **dependent_launch(x.device),
    )
    return activations


def down_in_half_pairs(
    activations: torch.Tensor, arenas: dict[str, torch.Tensor], table: torch.Tensor | None, rows: torch.Tensor,
    weights: torch.Tensor, limit: float, columns: tuple[str, ...], tiles: Tiles,
) -> torch.Tensor:
    """`gate_up_in_half_pairs`'s activations [T * k, W] -> one float32 row per pick [T * k, H], its bias added and
    its routing weight applied (`sum_picks` adds a token's picks)."""
    num_pairs, width = activations.shape
    hidden_size = arenas["down_proj_bias"].shape[1]
    down_columns = [columns.index(f"down_proj_{part}") for part in ("blocks", "scales", "bias")]
    per_pick = torch.empty((num_pairs, hidden_size), dtype=torch.float32, device=activations.device)
    _half_pairs_down_kernel[(num_pairs, triton.cdiv(hidden_size, tiles.features))](
        activations, arenas["down_proj_blocks"].view(torch.int32), arenas["down_proj_scales"],
        arenas["down_proj_bias"], table, rows, weights, per_pick, *down_columns,
        H=hidden_size, W=width, COLUMNS=len(columns),
        ACT_UNSCALE=2.0 ** (LARGEST_INPUT_EXPONENT - activation_shift(limit)),
        BLOCK_N=tiles.features, num_warps=tiles.warps, **dependent_launch(activations.device),
    )
    return per_pick


@triton.jit
def clamped_swiglu(gate, up, limit, alpha):
    """GPT-OSS's activation of a gate and up value (float32), for both expert kernels: the torch reference's
    `clamped_swiglu` (gpt_oss_experts.py) on values already split into gate and up."""
    gate = tl.minimum(gate, limit)
    up = tl.minimum(tl.maximum(up, -limit), limit)
    return (up + 1) * gate * tl.sigmoid(alpha * gate)


@triton.jit
def _expert(table_ptr, row, weight_ptr, scale_ptr, bias_ptr, weight_column, scale_column, bias_column,
            COLUMNS: tl.constexpr, N: tl.constexpr, K: tl.constexpr):
    """The pointers of the tensors of the expert in row `row` of the address table, or in slot `row` of the arenas
    (N x K weights a slot) where there is no table."""
    if table_ptr is None:
        weights, scales, biases = weight_ptr + row * (N * K // 8), scale_ptr + row * (N * K // 32), bias_ptr + row * N
    else:
        weights = row_pointer(table_ptr, row, weight_column, COLUMNS, weight_ptr)
        scales = row_pointer(table_ptr, row, scale_column, COLUMNS, scale_ptr)
        biases = row_pointer(table_ptr, row, bias_column, COLUMNS, bias_ptr)
    return weights, scales, biases


@triton.jit
def _half_pairs_gate_up_kernel(
    pairs_ptr, unscale_ptr, weight_ptr, scale_ptr, bias_ptr, table_ptr, rows_ptr, activations_ptr,
    limit, alpha, weight_column, scale_column, bias_column,
    H: tl.constexpr, W: tl.constexpr, PICKS: tl.constexpr, COLUMNS: tl.constexpr, ACT_SCALE: tl.constexpr,
    BLOCK_N: tl.constexpr, PDL: tl.constexpr,
):
    after_earlier_kernels_only(PDL)
    pair = tl.program_id(0)
    row = tl.load(rows_ptr + pair).to(tl.int64)  # int64: row * expert size passes 2^31
    if row < 0:
        return
    weights, scales, biases = _expert(table_ptr, row, weight_ptr, scale_ptr, bias_ptr, weight_column, scale_column,
                                      bias_column, COLUMNS, 2 * W, H)
    token = pair // PICKS
    features = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    inputs = pairs_ptr.to(tl.pointer_type(tl.int32), bitcast=True) + token * (H // 2)  # K / 2 uint32 pairs a row
    acc = mxfp4_rows_times_half_pairs(inputs, weights, scales, features, 2 * W, H, BLOCK_N)
    acc = acc * tl.load(unscale_ptr + token) + tl.load(biases + features, mask=features < 2 * W).to(tl.float32)
    gate, up = tl.split(tl.reshape(acc, (BLOCK_N // 2, 2)))  # rows alternate gate, up
    activation = clamped_swiglu(gate, up, limit, alpha) * ACT_SCALE  # read by down as its inputs: scaled
    columns = tl.program_id(1) * (BLOCK_N // 2) + tl.arange(0, BLOCK_N // 2)
    tl.store(activations_ptr + pair * W + pair_order(columns, W), activation.to(tl.float16), mask=columns < W)


@triton.jit
def _half_pairs_down_kernel(
    activations_ptr, weight_ptr, scale_ptr, bias_ptr, table_ptr, rows_ptr, routing_ptr, per_pick_ptr,
    weight_column, scale_column, bias_column,
    H: tl.constexpr, W: tl.constexpr, COLUMNS: tl.constexpr, ACT_UNSCALE: tl.constexpr, BLOCK_N: tl.constexpr,
    PDL: tl.constexpr,
):
    after_earlier_kernels_only(PDL)
    pair = tl.program_id(0)
    row = tl.load(rows_ptr + pair).to(tl.int64)  # int64: row * expert size passes 2^31
    if row < 0:
        return
    weights, scales, biases = _expert(table_ptr, row, weight_ptr, scale_ptr, bias_ptr, weight_column, scale_column,
                                      bias_column, COLUMNS, H, W)
    features = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    inputs = activations_ptr.to(tl.pointer_type(tl.int32), bitcast=True) + pair * (W // 2)
    acc = mxfp4_rows_times_half_pairs(inputs, weights, scales, features, H, W, BLOCK_N)
    bias = tl.load(biases + features, mask=features < H).to(tl.float32)
    acc = (acc * ACT_UNSCALE + bias) * tl.load(routing_ptr + pair).to(tl.float32)
    tl.store(per_pick_ptr + pair * H + features, acc, mask=features < H)
