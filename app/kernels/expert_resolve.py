"""Where one MoE layer call reads each picked expert, decided on the device: no host round trip per layer.

A picked expert in a cache slot is read there (a hit). A missed one takes the next victim slot of a queue
that the host filled between passes (the policy's lowest-scored slots first, free ones before them),
skipping victims that this pass has used already: it is listed for expert_fetch.py, which copies it from
page-locked host memory into that slot with the whole GPU, and the expert kernels read it there. When the
queue runs dry, a miss is read in place from host memory instead (a GPU's expert kernels read host memory at
about half the speed the copy kernel does: bench/NOTES.md).

The device keeps the residency: `slot_of` (layer, expert) -> slot, `owner` slot -> flat (layer, expert),
`stamp` slot -> the pass that last used it; per-expert use counts and totals accumulate until the host
reads them (to score the policy and report hits and misses).

`resolve_experts` is the Triton kernel (one program per call); `resolve_experts_torch` the reference.
"""

from typing import NamedTuple

import torch
import triton
import triton.language as tl

HITS, MISSES, ADMITTED, EVICTED = range(4)  # columns of `counts`


class Residency(NamedTuple):
    """The device side of an expert cache of S slots over layers < L, E experts a layer, C tensors an expert."""

    slot_of: torch.Tensor  # [L, E + 1] int64 slot or -1; the last column stays -1 (another device's picks)
    owner: torch.Tensor  # [S] int64 flat index into slot_of of the expert in each slot, or -1 (free)
    stamp: torch.Tensor  # [S] int64 the pass that last used each slot
    pass_number: torch.Tensor  # [1] int64, counted up by the first MoE layer of every pass
    victims: torch.Tensor  # [2 + Q] int64: how many are taken, how many are queued, then the queued slots in order
    host_rows: torch.Tensor  # [L, E, C] int64 addresses of every expert's tensors in page-locked host memory
    slot_rows: torch.Tensor  # [S, C] int64 addresses of every slot's tensors
    uses: torch.Tensor  # [L, E] int32 calls that picked each expert, since the host last read them
    counts: torch.Tensor  # [4] int64 HITS, MISSES, ADMITTED, EVICTED since the host last read them


def victim_window(num_pairs: int, num_experts: int, capacity: int) -> int:
    """How many queued victims one call looks at: room for every miss it can have and as many already used."""
    return min(2 * triton.next_power_of_2(min(num_pairs, num_experts)), triton.next_power_of_2(max(capacity, 1)))


def resolve_experts(experts: torch.Tensor, layer: int, first: bool, residency: Residency, reads: torch.Tensor,
                    sources: torch.Tensor) -> torch.Tensor:
    """experts [P] int64 picked by one layer call (-1: none) -> for the experts picked (rows of others are left
    as they are) the address table the expert kernels read, reads [E, C], and where each admitted miss is
    copied from, sources [E, C] (0 for the others); returns the admitted misses to fetch, in order, [P] int64
    (-1 past them). Updates the residency."""
    num_experts, columns = reads.shape
    num_pairs, capacity = experts.numel(), residency.victims.numel() - 2
    fetched = torch.empty(num_pairs, dtype=torch.long, device=experts.device)
    _resolve_kernel[(1,)](
        experts, *residency, reads, sources, fetched, layer, num_pairs,
        NUM_EXPERTS=num_experts, COLUMNS=columns, FIRST=first,
        BLOCK_P=triton.next_power_of_2(num_pairs), BLOCK_E=triton.next_power_of_2(num_experts),
        BLOCK_V=victim_window(num_pairs, num_experts, capacity), BLOCK_C=triton.next_power_of_2(columns),
        num_warps=4 if num_experts * num_pairs <= 4096 else 8,
    )
    return fetched


def resolve_experts_torch(experts: torch.Tensor, layer: int, first: bool, residency: Residency,
                          reads: torch.Tensor, sources: torch.Tensor) -> torch.Tensor:
    """`resolve_experts`, one expert at a time on the host."""
    r = residency
    fetched = []
    num_experts = reads.shape[0]
    if first:
        r.pass_number.add_(1)
    now = int(r.pass_number)
    picked = sorted({e for e in experts.tolist() if e >= 0})
    slots = {e: int(r.slot_of[layer, e]) for e in picked}
    hit_slots = {slot for slot in slots.values() if slot >= 0}
    for slot in hit_slots:
        r.stamp[slot] = now
    cursor, length, queue = int(r.victims[0]), int(r.victims[1]), r.victims[2:].tolist()
    window = victim_window(experts.numel(), num_experts, len(queue))
    free = [i for i in range(cursor, min(cursor + window, length))
            if int(r.stamp[queue[i]]) != now and queue[i] not in hit_slots]
    for expert in picked:
        r.uses[layer, expert] += 1
        if slots[expert] >= 0:
            reads[expert] = r.slot_rows[slots[expert]]
            sources[expert] = 0
            r.counts[HITS] += 1
            continue
        r.counts[MISSES] += 1
        reads[expert] = r.host_rows[layer, expert]
        sources[expert] = 0
        if not free:
            continue
        taken = free.pop(0)
        r.victims[0] = cursor = taken + 1
        slot = queue[taken]
        old = int(r.owner[slot])
        if old >= 0:
            r.slot_of.view(-1)[old] = -1
            r.counts[EVICTED] += 1
        r.owner[slot] = layer * r.slot_of.shape[1] + expert
        r.slot_of[layer, expert] = slot
        r.stamp[slot] = now
        reads[expert], sources[expert] = r.slot_rows[slot], r.host_rows[layer, expert]
        fetched.append(expert)
        r.counts[ADMITTED] += 1
    fetched += [-1] * (experts.numel() - len(fetched))
    return torch.tensor(fetched, dtype=torch.long)


@triton.jit
def _resolve_kernel(
    experts_ptr, slot_of_ptr, owner_ptr, stamp_ptr, pass_ptr, victims_ptr, host_rows_ptr, slot_rows_ptr, uses_ptr,
    counts_ptr, reads_ptr, sources_ptr, fetched_ptr, layer, num_pairs,
    NUM_EXPERTS: tl.constexpr, COLUMNS: tl.constexpr, FIRST: tl.constexpr,
    BLOCK_P: tl.constexpr, BLOCK_E: tl.constexpr, BLOCK_V: tl.constexpr, BLOCK_C: tl.constexpr,
):
    """Vectors over experts (E), pairs (P) and the victim window (V). No value stored here is loaded again by
    another thread, except through data that depends on its own load, so the program needs no barrier."""
    now = tl.load(pass_ptr) + FIRST
    if FIRST:
        tl.store(pass_ptr, now)
    expert = tl.arange(0, BLOCK_E)
    expert_ok = expert < NUM_EXPERTS
    pair = tl.arange(0, BLOCK_P)
    picks = tl.load(experts_ptr + pair, mask=pair < num_pairs, other=-1)
    picked = tl.max((picks[:, None] == expert[None, :]).to(tl.int32), axis=0) > 0  # [E]
    row_of_layer = layer * (NUM_EXPERTS + 1)
    slot = tl.load(slot_of_ptr + row_of_layer + expert, mask=expert_ok, other=-1)
    hit = picked & (slot >= 0)
    miss = picked & (slot < 0)
    tl.store(stamp_ptr + slot, now, mask=hit)

    cursor = tl.load(victims_ptr)
    window = tl.arange(0, BLOCK_V)
    queued = cursor + window < tl.load(victims_ptr + 1)
    victim = tl.load(victims_ptr + 2 + cursor + window, mask=queued, other=0)
    # used by an earlier layer of this pass, or a hit of this call (its stamp may not be stored yet)
    used = tl.load(stamp_ptr + victim, mask=queued, other=0) == now
    used |= tl.max(((victim[:, None] == slot[None, :]) & hit[None, :]).to(tl.int32), axis=1) > 0
    free = queued & ~used
    miss_rank = tl.cumsum(miss.to(tl.int32), 0) - 1
    free_rank = tl.cumsum(free.to(tl.int32), 0) - 1
    match = miss[:, None] & free[None, :] & (miss_rank[:, None] == free_rank[None, :])  # [E, V]
    admitted = tl.max(match.to(tl.int32), axis=1) > 0
    new_slot = tl.sum(tl.where(match, victim[None, :], 0), axis=1)
    taken = tl.max(match.to(tl.int32), axis=0) > 0
    tl.store(victims_ptr, cursor + tl.max(tl.where(taken, window + 1, 0), axis=0))

    old = tl.load(owner_ptr + new_slot, mask=admitted, other=-1)
    evicted = admitted & (old >= 0)
    tl.store(slot_of_ptr + old, -1, mask=evicted)
    tl.store(owner_ptr + new_slot, row_of_layer + expert, mask=admitted)
    tl.store(slot_of_ptr + row_of_layer + expert, new_slot, mask=admitted)
    tl.store(stamp_ptr + new_slot, now, mask=admitted)

    column = tl.arange(0, BLOCK_C)
    column_ok = column < COLUMNS
    rows = expert[:, None] * COLUMNS + column[None, :]  # [E, C]
    from_slot = tl.load(slot_rows_ptr + slot[:, None] * COLUMNS + column[None, :],
                        mask=hit[:, None] & column_ok[None, :], other=0)
    from_host = tl.load(host_rows_ptr + layer * NUM_EXPERTS * COLUMNS + rows,
                        mask=miss[:, None] & column_ok[None, :], other=0)
    into_slot = tl.load(slot_rows_ptr + new_slot[:, None] * COLUMNS + column[None, :],
                        mask=admitted[:, None] & column_ok[None, :], other=0)
    # admitted misses are copied into their slot first and read there
    reads = tl.where(admitted[:, None], into_slot, from_slot + from_host)
    sources = tl.where(admitted[:, None], from_host, 0)
    admit_rank = tl.cumsum(admitted.to(tl.int32), 0) - 1
    listed = (admitted[None, :] & (admit_rank[None, :] == pair[:, None])).to(tl.int64)  # [P, E]
    tl.store(fetched_ptr + pair, tl.sum(listed * (expert[None, :] + 1), axis=1) - 1, mask=pair < num_pairs)
    tl.store(reads_ptr + rows, reads, mask=picked[:, None] & column_ok[None, :])
    tl.store(sources_ptr + rows, sources, mask=picked[:, None] & column_ok[None, :])

    uses = tl.load(uses_ptr + layer * NUM_EXPERTS + expert, mask=expert_ok, other=0)
    tl.store(uses_ptr + layer * NUM_EXPERTS + expert, uses + picked.to(tl.int32), mask=expert_ok)
    tally = tl.arange(0, 4)
    counted = tl.where(tally == 0, tl.sum(hit.to(tl.int64), 0), tl.where(tally == 1, tl.sum(miss.to(tl.int64), 0),
                       tl.where(tally == 2, tl.sum(admitted.to(tl.int64), 0), tl.sum(evicted.to(tl.int64), 0))))
    tl.store(counts_ptr + tally, tl.load(counts_ptr + tally) + counted)
