"""`plan_tiles` (expert_tiles.py) in Triton's interpreter, against what its TilePlan promises the expert kernels."""

import pytest
import torch

from app.kernels.expert_tiles import plan_tiles

NUM_SLOTS = 9


@pytest.mark.parametrize("pairs_per_tile", [1, 2, 16, 32])
# up to 256 pairs the plan is one program, past it ranks spread over programs and a launch for the tiles
@pytest.mark.parametrize(("tokens", "picks"), [(1, 5), (37, 1), (40, 4), (75, 4)],
                         ids=["5-pairs", "37-pairs", "160-pairs", "300-pairs"])
def test_the_plan_sorts_the_pairs_by_slot_into_tiles_of_one_slot(tokens, picks, pairs_per_tile):
    generator = torch.Generator().manual_seed(tokens * 10 + picks)
    # about a quarter skipped, the first pair always: it must move behind every kept pair
    slots = torch.randint(-3, NUM_SLOTS, (tokens, picks), generator=generator).clamp(min=-1)
    slots[0, 0] = -1
    plan = plan_tiles(slots, NUM_SLOTS, pairs_per_tile)

    flat = slots.flatten().tolist()
    kept = sorted((pair for pair, slot in enumerate(flat) if slot >= 0), key=flat.__getitem__)  # stable sort
    sorted_pairs, sorted_slots = plan.sorted_pairs.tolist(), plan.sorted_slots.tolist()
    assert sorted_pairs[: len(kept)] == kept
    assert sorted_slots[: len(kept)] == [flat[pair] for pair in kept]
    # then the skipped picks and the padding, each once, under a slot no tile has
    assert sorted(sorted_pairs[len(kept):]) == sorted(set(range(len(sorted_pairs))) - set(kept))
    assert set(sorted_slots[len(kept):]) == {NUM_SLOTS}

    count = int(plan.tile_count)
    assert count <= plan.max_tiles
    starts = sorted(plan.tile_starts[:count].tolist())
    assert starts[0] == 0
    for start, end in zip(starts, [*starts[1:], len(kept)], strict=True):  # a tile runs up to the next one
        assert start < end and len(set(sorted_slots[start:end])) == 1, "a tile crosses a slot boundary"
        assert start % pairs_per_tile == 0 or sorted_slots[start - 1] != sorted_slots[start]
        # tile_rows reads a tile only up to the next multiple of pairs_per_tile (so it holds at most that many)
        assert end <= (start // pairs_per_tile + 1) * pairs_per_tile
