"""Triton kernels for GPT-OSS routed experts: one launch per projection for all tokens and picks.

Pairs (token, pick) are grouped into tiles that share an expert (expert_tiles.py), so each tile reads its
expert's weights once, from wherever its row of an address table (expert_table.py) points: a cache slot,
or page-locked host memory read over PCIe in place; MXFP4 is dequantized on the fly (`tl.dot_scaled`).
Weights are the M side of each product (out^T = W @ x^T), so the token side of a tile can be as small as 16.
At decode and in verify blocks (a few pairs per expert) MXFP4 products run on CUDA cores instead
(mxfp4_cuda_cores.py): no matrix unit, one or two pairs per tile; with bf16 activations and one pair per tile (the
default) in float16 pairs, two weights per instruction, with no tiles at all (gpt_oss_experts_half_pairs.py).

- gate_up: biases and the clamped SwiGLU in the epilogue -> activations [P, W], in sorted order.
- down: bias and routing weight in the epilogue -> one float32 row per pick [P, H].
- `sum_picks` adds each token's picks in pick order (deterministic, no atomics).
"""

import math

import torch
import triton
import triton.language as tl

from app.kernels.expert_table import columns, row_pointer, slot_table
from app.kernels.expert_tiles import (
    GROUP_MAJOR,
    IN_ORDER,
    INTERPRETED,
    MAX_PAIRS,
    LaunchConfig,
    Tiles,
    plan_tiles,
    store_activations,
    sum_picks,
    tile_rows,
)
from app.kernels.gpt_oss_experts_half_pairs import clamped_swiglu, run_in_half_pairs
from app.kernels.mxfp4_cuda_cores import X_SCALE, group_major, mxfp4_rows_times_inputs
from app.kernels.pick_rows import PickRows

# MXFP4 launches of at most this many (token, pick) pairs (verify blocks of up to 16 tokens) take the float16-pair
# programs, one pair per program: a shared expert is read once per pair, mostly from L2, where its pairs' programs
# run together. On the H100 (graphs, 32 experts of gpt-oss-20b, bench/NOTES.md) T = 2 / 4 / 8 / 16 took 44 / 71 /
# 121 / 225 us in them against 136 / 208 / 309 / 410 on the matrix units
CUDA_CORE_PAIRS = 64
# one pair per program; bf16 activations in float16 pairs, one-warp programs of 2 rows for gate_up and 4 for down:
# 15.8 + 8.7 us on the H200 at T = 1 (2 rows both 15.7 + 9.6, 8 rows / 4 warps 17.9 + 10.4, bench/NOTES.md)
HALF_PAIRS_ROWS, HALF_PAIRS_DOWN_ROWS = 2, 4


def pick_config(num_pairs: int, mxfp4: bool) -> LaunchConfig:
    if mxfp4 and num_pairs <= CUDA_CORE_PAIRS:
        # Triton's interpreter runs each program in turn: 128 rows a program there (a tiny model's projection in
        # one or two) keep CI's kernel suite, whose prompts and verify blocks also run here, within its time limit
        # (16 rows: unfinished after 1350 s; 128: 663 s in all); one test runs the GPU's rows on a small expert
        return half_pairs_config(128) if INTERPRETED else half_pairs_config(HALF_PAIRS_ROWS, HALF_PAIRS_DOWN_ROWS)
    return matrix_unit_config(num_pairs, mxfp4)


def runs_in_half_pairs(config: LaunchConfig, dtype: torch.dtype) -> bool:
    """Whether `config` runs hidden states of `dtype` in the float16-pair programs (float32 keeps float32 products)."""
    return config.half_pairs and dtype != torch.float32


def half_pairs_config(rows: int, down_rows: int | None = None) -> LaunchConfig:
    """One-warp float16-pair programs of `rows` rows (`down_rows` for down, if given)."""
    down = Tiles(down_rows or rows, 1024, warps=1)
    return LaunchConfig(1, Tiles(rows, 1024, warps=1), down, cuda_cores=True, half_pairs=True)


def matrix_unit_config(num_pairs: int, mxfp4: bool) -> LaunchConfig:
    pairs_per_tile = 16 if num_pairs <= 256 else 32
    if mxfp4:
        return LaunchConfig(pairs_per_tile, Tiles(64, 64), Tiles(32, 64))
    return LaunchConfig(pairs_per_tile, Tiles(64, 64, stages=4), Tiles(64, 128))


def run_experts(
    hidden: torch.Tensor,
    arenas: dict[str, torch.Tensor],
    slots: torch.Tensor,
    weights: torch.Tensor,
    limit: float,
    alpha: float,
    config: LaunchConfig | None = None,
    hidden_pairs: tuple[torch.Tensor, torch.Tensor] | None = None,
) -> torch.Tensor | PickRows:
    """hidden [T, H], slots [T, k] (-1: skip), weights [T, k] -> weighted expert sum [T, H]; `hidden_pairs`, hidden
    as `mxfp4_half_pairs.half_pairs` gives it, where the float16-pair programs run
    (gpt_oss_experts.takes_hidden_pairs): then the picks' rows before their sum (pick_rows.py)."""
    return run_from_table(hidden, arenas, None, slots, weights, limit, alpha, config, hidden_pairs)


def run_from_table(
    hidden: torch.Tensor,
    arenas: dict[str, torch.Tensor],
    table: torch.Tensor | None,
    rows: torch.Tensor,
    weights: torch.Tensor,
    limit: float,
    alpha: float,
    config: LaunchConfig | None = None,
    hidden_pairs: tuple[torch.Tensor, torch.Tensor] | None = None,
) -> torch.Tensor | PickRows:
    """`run_experts` reading each expert where its row of the address table [R, C] points: rows [T, k] (-1:
    skip). The arenas give the tensors' names, shapes and dtypes (the table's columns); no table: the rows are the
    arenas' slots."""
    tokens, picks = rows.shape
    chunk = max(1, MAX_PAIRS // picks)
    if tokens > chunk:
        parts = (slice(i, i + chunk) for i in range(0, tokens, chunk))
        return torch.cat([run_from_table(hidden[p], arenas, table, rows[p], weights[p], limit, alpha, config)
                          for p in parts])
    assert hidden.dim() == 2 and hidden.shape[0] == tokens and weights.shape == rows.shape
    assert all(t.is_contiguous() for t in arenas.values()), "expert arenas must be contiguous"
    hidden, rows, weights = hidden.contiguous(), rows.contiguous(), weights.contiguous()
    mxfp4 = "gate_up_proj_blocks" in arenas
    names = columns(arenas)
    if mxfp4:
        gate_up, gate_up_scales = arenas["gate_up_proj_blocks"], arenas["gate_up_proj_scales"]
        down, down_scales = arenas["down_proj_blocks"], arenas["down_proj_scales"]
        two_width = gate_up.shape[1]
        gate_up_columns = [names.index(f"gate_up_proj_{part}") for part in ("blocks", "scales", "bias")]
        down_columns = [names.index(f"down_proj_{part}") for part in ("blocks", "scales", "bias")]
    else:
        gate_up, down = arenas["gate_up_proj"], arenas["down_proj"]
        gate_up_scales, down_scales = gate_up, down  # unused: typed pointers only
        two_width = gate_up.shape[2]
        gate_up_columns = [names.index(name) for name in ("gate_up_proj", "gate_up_proj", "gate_up_proj_bias")]
        down_columns = [names.index(name) for name in ("down_proj", "down_proj", "down_proj_bias")]
    hidden_size, width = hidden.shape[1], two_width // 2
    assert not mxfp4 or (hidden_size % 32 == 0 and width % 32 == 0), "MXFP4 groups are 32 wide"
    config = config or pick_config(rows.numel(), mxfp4)

    assert not config.cuda_cores or mxfp4, "CUDA-core products are for MXFP4 weights"
    assert not config.half_pairs or (config.cuda_cores and config.pairs_per_tile == 1), "half pairs: 1 pair a tile"
    if runs_in_half_pairs(config, hidden.dtype):
        return run_in_half_pairs(hidden, arenas, table, rows, weights, limit, alpha, names,
                                 (config.gate_up, config.down), hidden_pairs)
    assert hidden_pairs is None, "hidden in float16 pairs is for the float16-pair programs (takes_hidden_pairs)"

    num_pairs, device = rows.numel(), hidden.device
    table = slot_table(arenas) if table is None else table
    plan = plan_tiles(rows, table.shape[0], config.pairs_per_tile)
    tiles_in = (plan.sorted_pairs, plan.sorted_slots, plan.tile_starts, plan.tile_count)
    if config.cuda_cores:  # the products read 8 codes at a time: [S, N, K/32, 16] bytes -> [S, N, K/32, 4] words
        gate_up, down = gate_up.view(torch.int32), down.view(torch.int32)
    shared = dict(
        MXFP4=mxfp4, F32_INPUTS=hidden.dtype == torch.float32, UPCAST=INTERPRETED, BLOCK_M=config.pairs_per_tile,
        CUDA_CORES=config.cuda_cores, COLUMNS=len(names),
    )
    # CUDA-core products read x as float32 by group (gate_up's kernel writes the activations so too)
    x = group_major(hidden) if config.cuda_cores else hidden
    activations = torch.empty((num_pairs, width), dtype=x.dtype, device=device)
    tiles = config.gate_up
    _gate_up_kernel[(plan.max_tiles, triton.cdiv(two_width, tiles.features))](
        x, gate_up, gate_up_scales, arenas["gate_up_proj_bias"], table, *tiles_in, activations,
        limit, alpha, hidden_size, width, picks, *gate_up_columns,
        **shared, BLOCK_N=tiles.features,
        BLOCK_K=_step(tiles, hidden_size, mxfp4, config.cuda_cores), num_warps=tiles.warps, num_stages=tiles.stages,
    )
    per_pick = torch.empty((num_pairs, hidden_size), dtype=torch.float32, device=device)
    tiles = config.down
    _down_kernel[(plan.max_tiles, triton.cdiv(hidden_size, tiles.features))](
        activations, down, down_scales, arenas["down_proj_bias"], table, weights, *tiles_in,
        per_pick, hidden_size, width, *down_columns,
        **shared, BLOCK_N=tiles.features, BLOCK_K=_step(tiles, width, mxfp4, config.cuda_cores),
        num_warps=tiles.warps, num_stages=tiles.stages,
    )
    return sum_picks(per_pick, rows, hidden.dtype)


def _step(tiles: Tiles, k_size: int, mxfp4: bool, cuda_cores: bool) -> int:
    """Inputs per loop step; MXFP4 steps on matrix units divide K (both are multiples of 32), so they need no
    tail masks; CUDA-core steps mask whole groups."""
    if cuda_cores:
        assert tiles.depth % 32 == 0 and tiles.depth & (tiles.depth - 1) == 0, "CUDA-core steps are 2^n groups"
        return tiles.depth
    return math.gcd(tiles.depth, k_size) if mxfp4 else tiles.depth


@triton.jit
def _expert_matmul(
    x_ptr, rows, used, weight_ptr, scale_ptr, features, n_size, k_size,
    MXFP4: tl.constexpr, F32_INPUTS: tl.constexpr, UPCAST: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
):
    """W[features, :] @ x[rows, :]^T -> [BLOCK_N, BLOCK_M] float32 (unused rows give 0), W one expert's weights:
    MXFP4 [N, K/2] bytes + [N, K/32] scales, or dense [K, N]."""
    feature_ok = features < n_size
    acc = tl.zeros((BLOCK_N, BLOCK_M), tl.float32)
    if MXFP4:
        # One 32-wide group per product: e2m1 -> bf16 is then a table lookup, and the group's
        # power-of-two scale multiplies the [BLOCK_N, BLOCK_M] result instead of every weight.
        groups = k_size // 32
        depth = tl.arange(0, 32)
        byte = tl.arange(0, 16)
        w_ptrs = weight_ptr + features[:, None] * (k_size // 2) + byte[None, :]
        s_ptrs = scale_ptr + features * groups
        x_ptrs = x_ptr + rows[None, :] * k_size + depth[:, None]  # [32, BLOCK_M]
        for _ in range(0, groups, BLOCK_K // 32):
            for step in tl.static_range(BLOCK_K // 32):  # BLOCK_K divides K here
                blocks = tl.load(w_ptrs + step * 16, mask=feature_ok[:, None], other=0)
                scale = tl.load(s_ptrs + step, mask=feature_ok, other=0)
                x = tl.load(x_ptrs + step * 32, mask=used[None, :], other=0)
                high = x.to(tl.bfloat16)
                products = tl.dot_scaled(blocks, None, "e2m1", high, None, "bf16")
                if F32_INPUTS:  # a second product on the bf16 rounding error keeps about 16 bits of x
                    low = (x - high.to(tl.float32)).to(tl.bfloat16)
                    products += tl.dot_scaled(blocks, None, "e2m1", low, None, "bf16")
                # scale byte s means 2^(s - 127): the float32 whose exponent field is s (0 -> 0.0)
                acc += products * (scale.to(tl.int32) << 23).to(tl.float32, bitcast=True)[:, None]
            w_ptrs += BLOCK_K // 2
            s_ptrs += BLOCK_K // 32
            x_ptrs += BLOCK_K
    else:
        depth = tl.arange(0, BLOCK_K)
        x_ptrs = x_ptr + rows[None, :] * k_size + depth[:, None]  # [BLOCK_K, BLOCK_M]
        w_ptrs = weight_ptr + depth[None, :] * n_size + features[:, None]
        for k0 in range(0, k_size, BLOCK_K):
            x = tl.load(x_ptrs, mask=used[None, :] & (depth[:, None] < k_size - k0), other=0.0)
            w = tl.load(w_ptrs, mask=feature_ok[:, None] & (depth[None, :] < k_size - k0), other=0.0)  # [N, K]
            if UPCAST:
                w, x = w.to(tl.float32), x.to(tl.float32)
            # float32 x: tf32x3 gives about float32 products; "tf32" is Triton's default, a no-op for bf16
            acc = tl.dot(w.to(x.dtype), x, acc, input_precision="tf32x3" if F32_INPUTS else "tf32")
            w_ptrs += BLOCK_K * n_size
            x_ptrs += BLOCK_K
    return acc


@triton.jit
def _products(
    x_ptr, inputs, used, table_ptr, row, weight_ptr, scale_ptr, weight_column, scale_column, features,
    n_size, k_size, MXFP4: tl.constexpr, F32_INPUTS: tl.constexpr, UPCAST: tl.constexpr, CUDA_CORES: tl.constexpr,
    COLUMNS: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
):
    """One projection of the tile's expert (row `row` of the address table), on CUDA cores or the matrix units."""
    weights = row_pointer(table_ptr, row, weight_column, COLUMNS, weight_ptr)
    scales = row_pointer(table_ptr, row, scale_column, COLUMNS, scale_ptr)
    if CUDA_CORES:
        acc = mxfp4_rows_times_inputs(
            x_ptr, inputs, used, weights, scales, features, n_size, k_size, BLOCK_M, BLOCK_N, BLOCK_K // 32,
        )
    else:
        acc = _expert_matmul(
            x_ptr, inputs, used, weights, scales, features, n_size, k_size, MXFP4, F32_INPUTS, UPCAST,
            BLOCK_M, BLOCK_N, BLOCK_K,
        )
    return acc


@triton.jit
def _gate_up_kernel(
    hidden_ptr, weight_ptr, scale_ptr, bias_ptr, table_ptr,
    sorted_pairs_ptr, sorted_slots_ptr, tile_starts_ptr, tile_count_ptr, activations_ptr,
    limit, alpha, hidden_size, width, picks, weight_column, scale_column, bias_column,
    MXFP4: tl.constexpr, F32_INPUTS: tl.constexpr, UPCAST: tl.constexpr, CUDA_CORES: tl.constexpr,
    COLUMNS: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
):
    if tl.program_id(0) >= tl.load(tile_count_ptr):
        return
    positions, row, used = tile_rows(tile_starts_ptr, sorted_slots_ptr, BLOCK_M)
    tokens = tl.load(sorted_pairs_ptr + positions, mask=used, other=0) // picks
    features = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    acc = _products(
        hidden_ptr, tokens, used, table_ptr, row, weight_ptr, scale_ptr, weight_column, scale_column,
        features, 2 * width, hidden_size, MXFP4, F32_INPUTS, UPCAST, CUDA_CORES, COLUMNS, BLOCK_M,
        BLOCK_N, BLOCK_K,
    )
    biases = row_pointer(table_ptr, row, bias_column, COLUMNS, bias_ptr)
    bias = tl.load(biases + features, mask=features < 2 * width, other=0.0)
    acc += bias.to(tl.float32)[:, None]
    # rows alternate gate, up: [BLOCK_N, M] -> [BLOCK_N/2, M, 2]
    gate, up = tl.split(tl.permute(tl.reshape(acc, (BLOCK_N // 2, 2, BLOCK_M)), (0, 2, 1)))
    activation = clamped_swiglu(gate, up, limit, alpha)
    if CUDA_CORES:  # the down products read them as the hidden states: float32 by group, scaled
        activation *= X_SCALE
    order: tl.constexpr = GROUP_MAJOR if CUDA_CORES else IN_ORDER
    store_activations(activations_ptr, activation, positions, used, width, BLOCK_N // 2, order)


@triton.jit
def _down_kernel(
    activations_ptr, weight_ptr, scale_ptr, bias_ptr, table_ptr, routing_ptr,
    sorted_pairs_ptr, sorted_slots_ptr, tile_starts_ptr, tile_count_ptr, per_pick_ptr, hidden_size, width,
    weight_column, scale_column, bias_column,
    MXFP4: tl.constexpr, F32_INPUTS: tl.constexpr, UPCAST: tl.constexpr, CUDA_CORES: tl.constexpr,
    COLUMNS: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
):
    if tl.program_id(0) >= tl.load(tile_count_ptr):
        return
    positions, row, used = tile_rows(tile_starts_ptr, sorted_slots_ptr, BLOCK_M)
    pairs = tl.load(sorted_pairs_ptr + positions, mask=used, other=0)
    features = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    acc = _products(
        activations_ptr, positions, used, table_ptr, row, weight_ptr, scale_ptr, weight_column,
        scale_column, features, hidden_size, width, MXFP4, F32_INPUTS, UPCAST, CUDA_CORES, COLUMNS,
        BLOCK_M, BLOCK_N, BLOCK_K,
    )
    biases = row_pointer(table_ptr, row, bias_column, COLUMNS, bias_ptr)
    bias = tl.load(biases + features, mask=features < hidden_size, other=0.0)
    routing = tl.load(routing_ptr + pairs, mask=used, other=0.0)
    acc = (acc + bias.to(tl.float32)[:, None]) * routing.to(tl.float32)[None, :]
    tl.store(
        per_pick_ptr + pairs[None, :] * hidden_size + features[:, None], acc,
        mask=used[None, :] & (features[:, None] < hidden_size),
    )
