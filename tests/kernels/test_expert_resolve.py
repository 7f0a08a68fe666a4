"""The residency kernel (expert_resolve.py) against its reference, in Triton's interpreter: over passes of several
layers with random picks, both leave the same residency, tables and tallies, and the residency stays sound."""

import pytest
import torch

from app.kernels.expert_resolve import (
    ADMITTED,
    EVICTED,
    HITS,
    MISSES,
    Residency,
    resolve_experts,
    resolve_experts_torch,
)

LAYERS, COLUMNS = 3, 5


def random_residency(num_experts: int, num_slots: int, queued: int, generator: torch.Generator) -> Residency:
    """Some slots hold random experts, the others are free; the queue lists `queued` slots, free ones first."""
    slot_of = torch.full((LAYERS, num_experts + 1), -1, dtype=torch.long)
    owner = torch.full((num_slots,), -1, dtype=torch.long)
    keys = torch.randperm(LAYERS * num_experts, generator=generator)[: num_slots * 3 // 4].tolist()
    for slot, key in enumerate(keys):
        layer, expert = divmod(key, num_experts)
        slot_of[layer, expert] = slot
        owner[slot] = layer * (num_experts + 1) + expert
    order = [*range(len(keys), num_slots), *torch.randperm(len(keys), generator=generator).tolist()]
    return Residency(
        slot_of=slot_of, owner=owner,
        stamp=torch.randint(0, 3, (num_slots,), generator=generator),
        pass_number=torch.tensor([2]),
        victims=torch.tensor([0, queued, *order[:queued], 0, 0]),  # room for two more
        host_rows=torch.randint(1, 2**40, (LAYERS, num_experts, COLUMNS), generator=generator),
        slot_rows=torch.randint(1, 2**40, (num_slots, COLUMNS), generator=generator),
        uses=torch.zeros(LAYERS, num_experts, dtype=torch.int32),
        counts=torch.zeros(4, dtype=torch.long),
    )


def clone(residency: Residency) -> Residency:
    return Residency(*(t.clone() for t in residency))


def check_sound(r: Residency, num_experts: int) -> None:
    """slot_of and owner are inverse maps of each other."""
    for slot, key in enumerate(r.owner.tolist()):
        if key >= 0:
            assert r.slot_of.view(-1)[key] == slot
    held = r.slot_of[:, :num_experts]
    assert (r.slot_of[:, num_experts] == -1).all()
    for layer, expert in (held >= 0).nonzero().tolist():
        assert r.owner[held[layer, expert]] == layer * (num_experts + 1) + expert


@pytest.mark.parametrize(("num_experts", "num_slots", "tokens", "picks", "queued"),
                         [(8, 6, 1, 2, 4), (8, 10, 3, 2, 10), (32, 24, 1, 4, 12), (6, 4, 4, 3, 1)])
def test_kernel_matches_reference_over_passes(num_experts, num_slots, tokens, picks, queued):
    generator = torch.Generator().manual_seed(num_experts * 100 + num_slots + tokens)
    kernel_state = random_residency(num_experts, num_slots, queued, generator)
    reference_state = clone(kernel_state)
    for pass_index in range(3):
        for layer in range(LAYERS):
            experts = torch.stack([torch.randperm(num_experts, generator=generator)[:picks] for _ in range(tokens)])
            experts[torch.rand(experts.shape, generator=generator) < 0.15] = -1  # another device's picks
            tables = [torch.full((num_experts, COLUMNS), -7, dtype=torch.long) for _ in range(4)]
            fetched = resolve_experts(experts.flatten(), layer, layer == 0, kernel_state, *tables[:2])
            expected = resolve_experts_torch(experts.flatten(), layer, layer == 0, reference_state, *tables[2:])
            assert fetched.tolist() == expected.tolist()
            for got, want in zip(kernel_state, reference_state, strict=True):
                assert torch.equal(got, want), (pass_index, layer)
            picked = sorted({e for e in experts.flatten().tolist() if e >= 0})
            assert torch.equal(tables[0][picked], tables[2][picked]) and torch.equal(tables[1][picked],
                                                                                     tables[3][picked])
            check_sound(kernel_state, num_experts)
        kernel_state.victims[0] = reference_state.victims[0] = 0  # the host refills the queue between passes


def test_a_miss_takes_a_free_slot_then_evicts_and_later_hits():
    num_experts = 4
    r = Residency(
        slot_of=torch.full((LAYERS, num_experts + 1), -1, dtype=torch.long),
        owner=torch.full((2,), -1, dtype=torch.long), stamp=torch.zeros(2, dtype=torch.long),
        pass_number=torch.zeros(1, dtype=torch.long), victims=torch.tensor([0, 2, 1, 0]),
        host_rows=torch.arange(1, 1 + LAYERS * num_experts * COLUMNS).view(LAYERS, num_experts, COLUMNS),
        slot_rows=torch.arange(1000, 1000 + 2 * COLUMNS).view(2, COLUMNS),
        uses=torch.zeros(LAYERS, num_experts, dtype=torch.int32), counts=torch.zeros(4, dtype=torch.long),
    )
    reads, sources = (torch.zeros(num_experts, COLUMNS, dtype=torch.long) for _ in range(2))
    fetched = resolve_experts(torch.tensor([2]), 0, True, r, reads, sources)  # a miss: fetched into slot 1
    assert fetched.tolist() == [2]
    assert torch.equal(reads[2], r.slot_rows[1]) and torch.equal(sources[2], r.host_rows[0, 2])
    assert r.slot_of[0, 2] == 1 and r.owner[1] == 2
    resolve_experts(torch.tensor([3]), 1, False, r, reads, sources)  # slot 0, free
    r.victims[:] = torch.tensor([0, 2, 1, 0])
    resolve_experts(torch.tensor([3]), 1, True, r, reads, sources)  # a new pass: (1, 3) hits in slot 0
    assert torch.equal(reads[3], r.slot_rows[0]) and (sources[3] == 0).all()
    fetched = resolve_experts(torch.tensor([0, 1]), 2, False, r, reads, sources)
    # (2, 0) evicts (0, 2) from slot 1; (2, 1) skips slot 0, which this pass used, and is only read in place
    assert fetched.tolist() == [0, -1]
    assert r.slot_of[0, 2] == -1 and r.slot_of[2, 0] == 1 and r.owner[1] == 2 * (num_experts + 1)
    assert torch.equal(reads[0], r.slot_rows[1]) and torch.equal(sources[0], r.host_rows[2, 0])
    assert torch.equal(reads[1], r.host_rows[2, 1]) and (sources[1] == 0).all() and r.slot_of[2, 1] == -1
    assert r.counts[HITS] == 1 and r.counts[MISSES] == 4 and r.counts[ADMITTED] == 3 and r.counts[EVICTED] == 1
    assert r.uses[1].tolist() == [0, 0, 0, 2] and r.uses[2].tolist() == [1, 1, 0, 0]


def test_the_admitted_misses_are_listed_in_order_and_read_from_their_slots():
    generator = torch.Generator().manual_seed(3)
    kernel_state = random_residency(8, 6, 4, generator)
    reference_state = clone(kernel_state)
    experts = torch.tensor([0, 3, 5, 6, 7, 1])
    tables = [torch.full((8, COLUMNS), -7, dtype=torch.long) for _ in range(4)]
    fetched = resolve_experts(experts, 1, True, kernel_state, *tables[:2])
    expected = resolve_experts_torch(experts, 1, True, reference_state, *tables[2:])
    assert fetched.tolist() == expected.tolist()
    listed = [e for e in fetched.tolist() if e >= 0]
    assert listed and fetched.tolist() == listed + [-1] * (len(experts) - len(listed))
    for expert in listed:
        assert torch.equal(tables[0][expert], kernel_state.slot_rows[kernel_state.slot_of[1, expert]])
        assert torch.equal(tables[1][expert], kernel_state.host_rows[1, expert])
    for got, want in zip(kernel_state, reference_state, strict=True):
        assert torch.equal(got, want)
    picked = sorted(set(experts.tolist()))
    assert torch.equal(tables[0][picked], tables[2][picked]) and torch.equal(tables[1][picked], tables[3][picked])
