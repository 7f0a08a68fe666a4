import torch

from app.engine.experts.cache import ExpertCache
from app.engine.experts.store import ExpertStore

LAYERS, EXPERTS = (0, 1), 4


def numbered_expert(layer: int, expert: int) -> dict[str, torch.Tensor]:
    """Expert tensors whose values say which expert they are."""
    return {"w": torch.full((3,), 10.0 * layer + expert), "b": torch.tensor([layer, expert], dtype=torch.uint8)}


def make_cache(slots: int, host_experts: int = LAYERS[-1] * EXPERTS + EXPERTS) -> ExpertCache:
    store = ExpertStore(numbered_expert, LAYERS, EXPERTS, host_experts, pin=False)
    return ExpertCache(store, slots, torch.device("cpu"))


def test_store_keeps_the_first_experts_in_ram_and_the_rest_on_disk():
    store = ExpertStore(numbered_expert, LAYERS, EXPERTS, host_experts=5, pin=False)
    assert [store.is_on_disk(1, e) for e in range(EXPERTS)] == [False, True, True, True]
    assert store.expert_bytes == 3 * 4 + 2
    assert torch.equal(store.expert(1, 2)["w"], torch.full((3,), 12.0))


def test_host_copies_share_one_allocation_of_the_planned_size():
    store = ExpertStore(numbered_expert, LAYERS, EXPERTS, host_experts=5, pin=False)
    assert len(store.host.buffer) == 5 * (512 + 512)  # two tensors per expert, each on a 512-byte boundary
    host_copy = store.expert(1, 0)["w"]
    assert host_copy.untyped_storage().data_ptr() == store.host.buffer.untyped_storage().data_ptr()
    assert torch.equal(host_copy, torch.full((3,), 10.0)) and store.expert(1, 0)["b"].tolist() == [1, 0]


def test_lru_evicts_the_least_recently_used_and_counts_bytes():
    cache = make_cache(slots=2)
    first = cache.ensure(0, [1, 2])
    cache.ensure(0, [1])  # 1 is now more recent than 2
    (slot,) = cache.ensure(1, [3])  # evicts (0, 2)
    assert slot == first[1]
    assert cache.resident() == {(0, 1), (1, 3)}
    assert torch.equal(cache.arenas["w"][slot], torch.full((3,), 13.0))
    assert torch.equal(cache.arenas["b"][slot], torch.tensor([1, 3], dtype=torch.uint8))
    stats = cache.stats
    assert (stats.hits, stats.misses, stats.evictions) == (1, 3, 1)
    assert stats.bytes_fetched == 3 * cache.store.expert_bytes


def test_disk_reads_are_counted_separately():
    cache = make_cache(slots=2, host_experts=2)
    cache.ensure(0, [0, 3])
    assert cache.stats.disk_reads == 1


def test_run_handles_more_experts_than_slots_in_groups():
    cache = make_cache(slots=2)
    hidden = torch.ones(3, 3)
    top_experts = torch.tensor([[0, 1], [2, 3], [3, 0]])
    top_weights = torch.tensor([[0.5, 0.5], [0.25, 0.75], [1.0, 0.0]])

    def weighted_expert_values(hidden, arenas, slots, weights):
        picked = torch.where(slots[..., None] >= 0, arenas["w"][slots.clamp(min=0)], 0.0)  # [T, k, 3]
        return hidden * (picked * weights[..., None]).sum(1)

    out = cache.run(1, hidden, top_experts, top_weights, weighted_expert_values)
    expected_per_token = torch.tensor([0.5 * 10 + 0.5 * 11, 0.25 * 12 + 0.75 * 13, 1.0 * 13])
    assert torch.allclose(out, expected_per_token[:, None].expand(3, 3))
    assert cache.stats.misses == 4


def test_a_cpu_cache_over_the_host_store_reads_every_expert_where_it_lies():
    store = ExpertStore(numbered_expert, LAYERS, EXPERTS, host_experts=len(LAYERS) * EXPERTS, pin=False)
    cache = ExpertCache.over_host_store(store)
    assert cache.complete and cache.resident() == {(layer, e) for layer in LAYERS for e in range(EXPERTS)}
    buffer = store.host.buffer.untyped_storage().data_ptr()
    for name, arena in cache.arenas.items():
        assert arena.untyped_storage().data_ptr() == buffer  # views of the store: nothing copied
        for layer in LAYERS:
            for expert in range(EXPERTS):
                slot = int(cache.slot_table[layer, expert])
                assert arena[slot].data_ptr() == store.expert(layer, expert)[name].data_ptr()
                assert torch.equal(arena[slot], numbered_expert(layer, expert)[name])
    assert int(cache.slot_table[0, EXPERTS]) == -1  # the column of other devices' picks stays empty
