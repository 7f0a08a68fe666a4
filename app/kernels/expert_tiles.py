"""Tiles of (token, pick) pairs that share an expert slot, for grouped expert kernels.

`plan_tiles` sorts the pairs by cache slot in one small launch, two for a prefill chunk's (no host
synchronisation); a tile is a run of up to BLOCK_M sorted pairs with one slot, so an expert kernel with one program
per tile reads each expert's weights once per tile. `sum_picks` adds each token's per-pick rows in pick
order: no atomics, so the result does not depend on how programs are scheduled.
"""

import os
from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from app.kernels.dependent_launch import after_earlier_kernels, dependent_launch

# how store_activations lays out a pair's activations [W]: as they are, or by group ([32, W/32], mxfp4_cuda_cores.py)
IN_ORDER, GROUP_MAJOR = tl.constexpr(0), tl.constexpr(1)
MAX_PAIRS = 2048  # (token, pick) pairs per launch: the plan ranks each against all of them
# up to this many pairs the plan is one program; past it the ranks are spread over programs of RANKS_PER_PROGRAM
# pairs and the tiles found by a second launch (one program ranked 2048 pairs in 103 us on an H100, a chunk of
# GLM-4.5-Air's prefill, against its experts' 1 ms)
ONE_PROGRAM_PAIRS = 256
RANKS_PER_PROGRAM = 64
# up to a verify block the tiles are bound by reading the weights (and count launches); past it, by the tensor cores
DECODE_TOKENS = 16
# whether the expert kernels run in Triton's interpreter (triton.jit reads the variable when they are
# defined), whose bf16 tl.dot is wrong: UPCAST
INTERPRETED = os.environ.get("TRITON_INTERPRET") == "1"


@dataclass(frozen=True)
class Tiles:
    """One projection's tiles: `features` outputs by `depth` inputs per step."""

    features: int
    depth: int
    warps: int = 4
    stages: int = 3


@dataclass(frozen=True)
class LaunchConfig:
    pairs_per_tile: int  # BLOCK_M, shared by both projections (the plan depends on it); >= 16 for tl.dot
    gate_up: Tiles
    down: Tiles
    fp16_products: bool = False  # FP8 weights with bf16 activations: multiply in float16 (x clamped to its range)
    # FP8 weights with 16-bit activations past a verify block's tokens, where FP8 tensor cores are: x quantized to
    # e4m3 (a scale per token), FP8 x FP8 products (fp8_products_triton.py)
    fp8_products: bool = False
    cuda_cores: bool = False  # MXFP4 at a few pairs per tile: products on CUDA cores (mxfp4_cuda_cores.py)
    # and at one pair per tile with bf16 activations: in float16 pairs, the tiles' features rows and warps per
    # program, all of K in one pass (gpt_oss_experts_half_pairs.py)
    half_pairs: bool = False


@dataclass
class TilePlan:
    sorted_pairs: torch.Tensor  # [BLOCK_P] int32: pair index (token * k + pick) in slot order
    sorted_slots: torch.Tensor  # [BLOCK_P] int32: their slots; skipped picks and padding last
    tile_starts: torch.Tensor  # [max_tiles] int32: first sorted position of each tile
    tile_count: torch.Tensor  # [1] int32: tiles in use; programs past it return at once
    max_tiles: int  # the grid size: chunks of BLOCK_M plus slot boundaries


def plan_tiles(slots: torch.Tensor, num_slots: int, pairs_per_tile: int) -> TilePlan:
    """slots [T, k] (-1: skip) -> the tiles of pairs sharing a slot, at most `pairs_per_tile` each."""
    num_pairs, device = slots.numel(), slots.device
    block_p = max(triton.next_power_of_2(num_pairs), pairs_per_tile)
    assert (num_slots + 1) * block_p < 2**31, "sort keys are int32"
    # chunks of BLOCK_M plus slot boundaries, and never more than the pairs (one pair per tile: P, not 2P - 1)
    max_tiles = min(num_pairs, triton.cdiv(num_pairs, pairs_per_tile) + min(num_pairs, num_slots) - 1)
    plan = TilePlan(
        sorted_pairs=torch.empty(block_p, dtype=torch.int32, device=device),
        sorted_slots=torch.empty(block_p, dtype=torch.int32, device=device),
        tile_starts=torch.empty(max_tiles, dtype=torch.int32, device=device),
        tile_count=torch.empty(1, dtype=torch.int32, device=device),
        max_tiles=max_tiles,
    )
    slots = slots.contiguous()
    if block_p <= ONE_PROGRAM_PAIRS:
        _plan_kernel[(1,)](
            slots, plan.sorted_pairs, plan.sorted_slots, plan.tile_starts, plan.tile_count, num_pairs, num_slots,
            BLOCK_P=block_p, BLOCK_M=pairs_per_tile, BLOCK_J=min(block_p, 32), num_warps=4,
        )
        return plan
    _rank_kernel[(block_p // RANKS_PER_PROGRAM,)](
        slots, plan.sorted_pairs, plan.sorted_slots, num_pairs, num_slots,
        BLOCK_P=block_p, BLOCK_R=RANKS_PER_PROGRAM, BLOCK_J=64, num_warps=4,
    )
    _tile_starts_kernel[(1,)](
        plan.sorted_slots, plan.tile_starts, plan.tile_count, num_slots, BLOCK_P=block_p, BLOCK_M=pairs_per_tile,
        num_warps=8,
    )
    return plan


def sum_picks(per_pick: torch.Tensor, slots: torch.Tensor, dtype: torch.dtype, always: int = 0) -> torch.Tensor:
    """per_pick [T * (k + always), H] float32 (rows of skipped picks never read), slots [T, k] -> [T, H] in `dtype`;
    each token's last `always` rows are taken whatever the slots say (a shared expert's)."""
    tokens, picks = slots.shape
    hidden_size = per_pick.shape[1]
    out = torch.empty((tokens, hidden_size), dtype=dtype, device=per_pick.device)
    block_t, block_h = min(16, triton.next_power_of_2(tokens)), 256
    _sum_picks_kernel[(triton.cdiv(tokens, block_t), triton.cdiv(hidden_size, block_h))](
        per_pick, slots.contiguous(), out, tokens, hidden_size, PICKS=picks, ALWAYS=always, BLOCK_T=block_t,
        BLOCK_H=block_h, **dependent_launch(per_pick.device),
    )
    return out


@triton.jit
def _plan_kernel(
    slots_ptr, sorted_pairs_ptr, sorted_slots_ptr, tile_starts_ptr, tile_count_ptr, num_pairs, num_slots,
    BLOCK_P: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_J: tl.constexpr,
):
    """Sort pairs by (slot, pair), skipped picks and padding last; a tile starts at every slot change
    and every BLOCK_M-aligned position."""
    _rank_pairs(slots_ptr, sorted_pairs_ptr, sorted_slots_ptr, tl.arange(0, BLOCK_P), num_pairs, num_slots,
                BLOCK_P, BLOCK_J)
    tl.debug_barrier()
    _store_tile_starts(sorted_slots_ptr, tile_starts_ptr, tile_count_ptr, num_slots, BLOCK_P, BLOCK_M)


@triton.jit
def _rank_kernel(slots_ptr, sorted_pairs_ptr, sorted_slots_ptr, num_pairs, num_slots,
                 BLOCK_P: tl.constexpr, BLOCK_R: tl.constexpr, BLOCK_J: tl.constexpr):
    """`_plan_kernel`'s sort for pairs [program * BLOCK_R, + BLOCK_R): a big chunk's pairs over many programs."""
    pairs = tl.program_id(0) * BLOCK_R + tl.arange(0, BLOCK_R)
    _rank_pairs(slots_ptr, sorted_pairs_ptr, sorted_slots_ptr, pairs, num_pairs, num_slots, BLOCK_P, BLOCK_J)


@triton.jit
def _tile_starts_kernel(sorted_slots_ptr, tile_starts_ptr, tile_count_ptr, num_slots,
                        BLOCK_P: tl.constexpr, BLOCK_M: tl.constexpr):
    _store_tile_starts(sorted_slots_ptr, tile_starts_ptr, tile_count_ptr, num_slots, BLOCK_P, BLOCK_M)


@triton.jit
def _rank_pairs(slots_ptr, sorted_pairs_ptr, sorted_slots_ptr, pair, num_pairs, num_slots,
                BLOCK_P: tl.constexpr, BLOCK_J: tl.constexpr):
    """Stores each of `pair` at its place in the order of (slot, pair): the number of smaller keys among all
    BLOCK_P, O(P) a pair and no sorting network; [BLOCK_J, pairs] so that each thread sums its own column."""
    key = _sort_key(slots_ptr, pair, num_pairs, num_slots, BLOCK_P)
    rank = tl.zeros(pair.shape, tl.int32)
    for first in range(0, BLOCK_P, BLOCK_J):
        others = _sort_key(slots_ptr, first + tl.arange(0, BLOCK_J), num_pairs, num_slots, BLOCK_P)
        rank += tl.sum((others[:, None] < key[None, :]).to(tl.int32), axis=0)
    tl.store(sorted_pairs_ptr + rank, pair)
    tl.store(sorted_slots_ptr + rank, key // BLOCK_P)


@triton.jit
def _store_tile_starts(sorted_slots_ptr, tile_starts_ptr, tile_count_ptr, num_slots,
                       BLOCK_P: tl.constexpr, BLOCK_M: tl.constexpr):
    """From the sorted slots: a tile starts at every slot change and every BLOCK_M-aligned position."""
    position = tl.arange(0, BLOCK_P)
    slot = tl.load(sorted_slots_ptr + position)
    previous = tl.load(sorted_slots_ptr + position - 1, mask=position > 0, other=-1)
    starts = (slot < num_slots) & ((position % BLOCK_M == 0) | (slot != previous))
    tile = tl.cumsum(starts.to(tl.int32), 0) - 1
    tl.store(tile_starts_ptr + tile, position, mask=starts)
    tl.store(tile_count_ptr, tl.sum(starts.to(tl.int32), 0))


@triton.jit
def _sort_key(slots_ptr, pairs, num_pairs, num_slots, BLOCK_P: tl.constexpr):
    """slot * BLOCK_P + pair, with skipped picks and padding as slot `num_slots`: distinct keys."""
    slot = tl.load(slots_ptr + pairs, mask=pairs < num_pairs, other=-1).to(tl.int32)
    return tl.where(slot < 0, num_slots, slot) * BLOCK_P + pairs


@triton.jit
def tile_rows(tile_starts_ptr, sorted_slots_ptr, BLOCK_M: tl.constexpr):
    """This program's tile: sorted positions [BLOCK_M], their slot, and which positions belong to it."""
    start = tl.load(tile_starts_ptr + tl.program_id(0))
    slot = tl.load(sorted_slots_ptr + start)
    positions = start + tl.arange(0, BLOCK_M)
    in_chunk = positions < (start // BLOCK_M + 1) * BLOCK_M
    used = in_chunk & (tl.load(sorted_slots_ptr + positions, mask=in_chunk, other=-1) == slot)
    return positions, slot.to(tl.int64), used  # int64: slot * expert size passes 2^31


@triton.jit
def store_activations(
    activations_ptr, activation, positions, used, width, COLUMNS: tl.constexpr, ORDER: tl.constexpr = IN_ORDER
):
    """A gate_up tile's activation [COLUMNS, BLOCK_M] into rows `positions` of activations [P, W], at this
    program's COLUMNS feature columns, each row in ORDER: IN_ORDER or GROUP_MAJOR ([32, W/32]: column c at
    c % 32, c // 32)."""
    columns = tl.program_id(1) * COLUMNS + tl.arange(0, COLUMNS)
    offsets = (columns % 32) * (width // 32) + columns // 32 if ORDER == GROUP_MAJOR else columns
    tl.store(
        activations_ptr + positions[None, :] * width + offsets[:, None],
        activation.to(activations_ptr.dtype.element_ty),
        mask=used[None, :] & (columns[:, None] < width),
    )


@triton.jit
def _sum_picks_kernel(
    per_pick_ptr, slots_ptr, out_ptr, tokens, hidden_size,
    PICKS: tl.constexpr, ALWAYS: tl.constexpr, BLOCK_T: tl.constexpr, BLOCK_H: tl.constexpr, PDL: tl.constexpr,
):
    after_earlier_kernels(PDL)
    token = tl.program_id(0) * BLOCK_T + tl.arange(0, BLOCK_T)
    columns = tl.program_id(1) * BLOCK_H + tl.arange(0, BLOCK_H)
    acc = tl.zeros((BLOCK_T, BLOCK_H), tl.float32)
    for pick in tl.static_range(PICKS + ALWAYS):
        if pick < PICKS:
            taken = tl.load(slots_ptr + token * PICKS + pick, mask=token < tokens, other=-1) >= 0
        else:
            taken = token < tokens
        rows = per_pick_ptr + (token * (PICKS + ALWAYS) + pick)[:, None] * hidden_size + columns[None, :]
        acc += tl.load(rows, mask=taken[:, None] & (columns[None, :] < hidden_size), other=0.0)
    tl.store(
        out_ptr + token[:, None] * hidden_size + columns[None, :], acc.to(out_ptr.dtype.element_ty),
        mask=(token[:, None] < tokens) & (columns[None, :] < hidden_size),
    )
