"""The device's side of the CPU expert tier: which of a layer call's misses the host's cores compute, handed over
and taken back through page-locked memory with no host synchronisation (the host's side: cpu/cpu_share.c).

`post_cpu_share` runs before the layer's residency kernel. Of the experts the call misses it gives the CPU as many
as make both finish together: the device fetches m - c misses at `fetch_s` each while the CPU computes c, at
`call_s` plus `pair_s` per (token, expert) pair, from the costs the host measured. The CPU's experts leave the
device's picks (-1) and count as misses here (the residency kernel counts the rest); their pairs (host store slot,
weight) and the call's hidden states go to the host with a new ticket. `add_cpu_share`, after the device's expert
kernels, waits until the host has answered that ticket and adds its result. A call that gives the CPU nothing
waits for nothing. If the host does not answer within seconds the wait gives up and flags `failed` (the host raises
at the next settle) rather than hang the GPU.

Both are Triton kernels; `post_cpu_share_torch` / `add_cpu_share_torch` are their references.
"""

from typing import NamedTuple

import torch
import triton
import triton.language as tl

from app.kernels.expert_resolve import MISSES
from app.kernels.expert_tiles import INTERPRETED
from app.plan_cpu_tier import cpu_count

REQUEST, DONE, STOP, TOKENS, STATUS = range(5)  # control's entries (enum control of cpu/cpu_share.c)
CPU_COMPUTED = 4  # the residency's counts column of misses the CPU computed
FETCH_S, CALL_S, PAIR_S = range(3)  # costs' entries, in seconds
WAIT_LOADS = 4_000_000  # reads of the host's answer before giving up: seconds over PCIe
BLOCK = 1024
# the same, as the kernels read them
_MISSES, _CPU_COMPUTED, _TOKENS, _REQUEST, _DONE = (tl.constexpr(i) for i in (MISSES, CPU_COMPUTED, TOKENS, REQUEST,
                                                                              DONE))


class CpuShareBuffers(NamedTuple):
    """The hand-over for calls of up to T_MAX tokens of hidden size H and k picks each."""

    control: torch.Tensor  # [8] int64, page-locked: REQUEST, DONE, STOP, TOKENS, STATUS
    slots: torch.Tensor  # [T_MAX * k] int64, page-locked: the host store slot of each CPU pair, -1 for the others
    weights: torch.Tensor  # [T_MAX * k] float32, page-locked
    x: torch.Tensor  # [T_MAX, H] float32, page-locked: the call's hidden states
    out: torch.Tensor  # [T_MAX, H] float32, page-locked: the host's result
    costs: torch.Tensor  # [3] float32 on the device: FETCH_S, CALL_S, PAIR_S
    ticket: torch.Tensor  # [1] int64 on the device: the last ticket handed over
    pending: torch.Tensor  # [1] int64 on the device: the ticket this call waits for, 0 for none
    failed: torch.Tensor  # [1] int64 on the device: 1 once a wait gave up

    @classmethod
    def allocate(cls, max_tokens: int, picks: int, hidden_size: int, device: torch.device) -> "CpuShareBuffers":
        """Zeros (slots -1); the host's buffers page-locked when `device` is a GPU."""
        pin = device.type == "cuda"

        def host(*shape, dtype=torch.float32, fill=0):
            return torch.full(shape, fill, dtype=dtype, pin_memory=pin)

        def on_device(size, dtype=torch.long):
            return torch.zeros(size, dtype=dtype, device=device)

        return cls(control=host(8, dtype=torch.long), slots=host(max_tokens * picks, dtype=torch.long, fill=-1),
                   weights=host(max_tokens * picks), x=host(max_tokens, hidden_size),
                   out=host(max_tokens, hidden_size), costs=on_device(3, torch.float32), ticket=on_device(1),
                   pending=on_device(1), failed=on_device(1))


def post_cpu_share(experts: torch.Tensor, weights: torch.Tensor, hidden: torch.Tensor, layer: int, store_base: int,
                   slot_of: torch.Tensor, uses: torch.Tensor, counts: torch.Tensor,
                   buffers: CpuShareBuffers) -> torch.Tensor:
    """experts [P] int64 (-1: none) and weights [P] of one call of hidden [T, H], slot_of / uses / counts the
    residency's (expert_resolve.py); the CPU's expert e is host store slot store_base + e -> the device's picks [P]."""
    num_pairs, num_experts = experts.numel(), uses.shape[1]
    device_picks = torch.empty_like(experts)
    _post_kernel[(1,)](
        experts, weights, hidden, slot_of, uses, counts, *buffers, device_picks, layer, store_base, num_pairs,
        hidden.numel(), hidden.shape[0], NUM_EXPERTS=num_experts, BLOCK_P=triton.next_power_of_2(num_pairs),
        BLOCK_E=triton.next_power_of_2(num_experts), BLOCK=BLOCK, FENCE=not INTERPRETED,
    )
    return device_picks


def add_cpu_share(out: torch.Tensor, buffers: CpuShareBuffers) -> None:
    """out [T, H] += the host's answer to the call's ticket, once it is there (nothing if the call gave none)."""
    _add_kernel[(triton.cdiv(out.numel(), BLOCK),)](out, *buffers, out.numel(), WAIT_LOADS, BLOCK=BLOCK,
                                                     FENCE=not INTERPRETED)


def post_cpu_share_torch(experts: torch.Tensor, weights: torch.Tensor, hidden: torch.Tensor, layer: int,
                         store_base: int, slot_of: torch.Tensor, uses: torch.Tensor, counts: torch.Tensor,
                         buffers: CpuShareBuffers) -> torch.Tensor:
    """`post_cpu_share` on the host."""
    b = buffers
    picks = experts.tolist()
    missed = sorted({e for e in picks if e >= 0 and int(slot_of[layer, e]) < 0})
    pairs = sum(e in missed for e in picks)
    count = cpu_count(len(missed), pairs, b.costs.tolist())
    on_cpu = set(missed[len(missed) - count:]) if count else set()
    b.pending.zero_()
    if not on_cpu:
        return experts.clone()
    for e in on_cpu:
        uses[layer, e] += 1
    counts[MISSES] += count
    counts[CPU_COMPUTED] += count
    cpu_pick = torch.tensor([e in on_cpu for e in picks])
    b.slots[: len(picks)] = torch.where(cpu_pick, experts + store_base, -1)
    b.weights[: len(picks)] = weights.float()
    b.x.view(-1)[: hidden.numel()] = hidden.flatten().float()
    b.ticket.add_(1)
    b.pending.copy_(b.ticket)
    b.control[TOKENS] = hidden.shape[0]
    b.control[REQUEST] = int(b.ticket)
    return torch.where(cpu_pick, -1, experts)


def add_cpu_share_torch(out: torch.Tensor, buffers: CpuShareBuffers) -> None:
    """`add_cpu_share` on the host (the answer must be there already)."""
    if int(buffers.pending) == 0:
        return
    assert int(buffers.control[DONE]) >= int(buffers.pending), "the host has not answered"
    out.copy_(out.float() + buffers.out.view(-1)[: out.numel()].view_as(out))


@triton.jit
def _system_fence(like):
    """Orders this thread's stores (or loads) before its later ones for every observer, the host included."""
    return tl.inline_asm_elementwise("fence.sc.sys; mov.b32 $0, $1;", "=r,r", [like], dtype=tl.int32,
                                     is_pure=False, pack=1)


@triton.jit
def _post_kernel(
    experts_ptr, weights_ptr, hidden_ptr, slot_of_ptr, uses_ptr, counts_ptr,
    control_ptr, slots_ptr, host_weights_ptr, x_ptr, out_ptr, costs_ptr, ticket_ptr, pending_ptr, failed_ptr,
    device_picks_ptr, layer, store_base, num_pairs, num_values, num_tokens,
    NUM_EXPERTS: tl.constexpr, BLOCK_P: tl.constexpr, BLOCK_E: tl.constexpr, BLOCK: tl.constexpr,
    FENCE: tl.constexpr,
):
    """One program: vectors over pairs (P) and experts (E)."""
    pair = tl.arange(0, BLOCK_P)
    pair_ok = pair < num_pairs
    picks = tl.load(experts_ptr + pair, mask=pair_ok, other=-1)
    expert = tl.arange(0, BLOCK_E)
    expert_ok = expert < NUM_EXPERTS
    matches = picks[:, None] == expert[None, :]  # [P, E]
    picked = tl.max(matches.to(tl.int32), axis=0) > 0
    row = layer * (NUM_EXPERTS + 1)
    missed = picked & (tl.load(slot_of_ptr + row + expert, mask=expert_ok, other=0) < 0)
    misses = tl.sum(missed.to(tl.int32), 0)
    pairs = tl.sum(tl.sum((matches & missed[None, :]).to(tl.int32), 1), 0)

    fetch_s, call_s, pair_s = tl.load(costs_ptr), tl.load(costs_ptr + 1), tl.load(costs_ptr + 2)
    per_expert = pair_s * pairs.to(tl.float32) / tl.maximum(misses, 1).to(tl.float32)
    even = tl.floor((misses.to(tl.float32) * fetch_s - call_s) / (fetch_s + per_expert))
    even = tl.minimum(tl.maximum(even, 0.0), misses.to(tl.float32)).to(tl.int32)
    more = tl.minimum(even + 1, misses)
    slower_even = tl.maximum((misses - even).to(tl.float32) * fetch_s,
                             tl.where(even > 0, call_s + even.to(tl.float32) * per_expert, 0.0))
    slower_more = tl.maximum((misses - more).to(tl.float32) * fetch_s, call_s + more.to(tl.float32) * per_expert)
    count = tl.where((more > even) & (slower_more < slower_even), more, even)

    rank = tl.cumsum(missed.to(tl.int32), 0) - 1
    on_cpu = missed & (rank >= misses - count)  # [E]
    cpu_pick = tl.max((matches & on_cpu[None, :]).to(tl.int32), axis=1) > 0  # [P]
    tl.store(device_picks_ptr + pair, tl.where(cpu_pick, -1, picks), mask=pair_ok)
    if count > 0:
        uses = tl.load(uses_ptr + layer * NUM_EXPERTS + expert, mask=expert_ok, other=0)
        tl.store(uses_ptr + layer * NUM_EXPERTS + expert, uses + on_cpu.to(tl.int32), mask=expert_ok)
        tl.store(counts_ptr + _MISSES, tl.load(counts_ptr + _MISSES) + count)
        tl.store(counts_ptr + _CPU_COMPUTED, tl.load(counts_ptr + _CPU_COMPUTED) + count)
        tl.store(slots_ptr + pair, tl.where(cpu_pick, picks + store_base, -1), mask=pair_ok)
        tl.store(host_weights_ptr + pair, tl.load(weights_ptr + pair, mask=pair_ok).to(tl.float32), mask=pair_ok)
        offsets = tl.arange(0, BLOCK)
        for start in range(0, num_values, BLOCK):
            at = start + offsets
            tl.store(x_ptr + at, tl.load(hidden_ptr + at, mask=at < num_values).to(tl.float32), mask=at < num_values)
        ticket = tl.load(ticket_ptr) + 1
        tl.store(ticket_ptr, ticket)
        tl.store(pending_ptr, ticket)
        tl.store(control_ptr + _TOKENS, tl.full([], num_tokens, tl.int64))  # an int argument of 1 is a constexpr
        if FENCE:
            _system_fence(offsets)
        tl.debug_barrier()
        tl.store(control_ptr + _REQUEST, ticket)
    else:
        tl.store(pending_ptr, 0)


@triton.jit
def _add_kernel(
    out_ptr, control_ptr, slots_ptr, host_weights_ptr, x_ptr, answer_ptr, costs_ptr, ticket_ptr, pending_ptr,
    failed_ptr, num_values, wait_loads, BLOCK: tl.constexpr, FENCE: tl.constexpr,
):
    pending = tl.load(pending_ptr)
    if pending > 0:
        done = tl.load(control_ptr + _DONE, volatile=True)
        loads = tl.full([], 1, tl.int32)
        while (done < pending) & (loads < wait_loads):
            done = tl.load(control_ptr + _DONE, volatile=True)
            loads += 1
        if done < pending:
            tl.store(failed_ptr, 1)
        at = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        if FENCE:
            _system_fence(at)
        answer = tl.load(answer_ptr + at, mask=at < num_values, volatile=True)
        value = tl.load(out_ptr + at, mask=at < num_values)
        tl.store(out_ptr + at, (value.to(tl.float32) + answer).to(value.dtype), mask=at < num_values)
