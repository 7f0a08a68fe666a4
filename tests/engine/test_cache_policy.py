import random
from collections import OrderedDict

import numpy as np
import pytest
import torch

from app.engine.experts.cache import ExpertCache
from app.engine.experts.cache_policy import DecayedUseEviction
from app.engine.experts.device_misses import follow_owners
from app.engine.experts.store import ExpertStore
from tests.engine.test_experts import numbered_expert


def uses(eviction: DecayedUseEviction, *keys) -> None:
    for key in keys:
        eviction.used(key)


def test_a_popular_expert_outlives_a_more_recent_one_that_lru_would_keep():
    trace = ("popular", "popular", "popular", "once")
    lru, decayed = DecayedUseEviction(half_life=1), DecayedUseEviction(half_life=100)
    uses(lru, *trace)
    uses(decayed, *trace)
    assert lru.victim() == "popular"  # the least recently used
    assert decayed.victim() == "once"  # used once, a moment ago: worth less than three uses


def test_old_popularity_decays_away():
    eviction = DecayedUseEviction(half_life=2)
    uses(eviction, "old", "old", "old", *["recent"] * 8)
    assert eviction.victim() == "old"


def test_kept_experts_are_skipped_and_the_lowest_kept_one_goes_when_nothing_else_is_resident():
    eviction = DecayedUseEviction(half_life=100)
    uses(eviction, "a", "b", "b", "c", "c", "c")
    assert eviction.victim(keep={"a"}) == "b"
    assert eviction.victim(keep={"a", "c"}) == "a"  # only kept experts are left
    assert eviction.victim() == "c"


def test_an_evicted_expert_comes_back_with_its_popularity():
    eviction = DecayedUseEviction(half_life=100)
    uses(eviction, "back", "back", "back", "other")
    assert eviction.victim(keep={"other"}) == "back"
    uses(eviction, "back", "new")  # reloaded: four uses now
    assert eviction.victim() == "other" and eviction.victim() == "new"


@pytest.mark.parametrize("half_life", [0.5, 1, 7, 40])
def test_the_victim_is_the_lowest_score_on_a_random_trace(half_life):
    """Brute force over the resident experts' scores; with a half-life of 1 use or less, that is LRU."""
    rng = random.Random(half_life)
    eviction, resident, recency = DecayedUseEviction(half_life), set(), OrderedDict()
    for _ in range(3000):
        key = min(rng.randrange(20), rng.randrange(20))  # skewed, like trained routing
        if key not in resident and len(resident) == 8:
            keep = set(rng.sample(sorted(resident), 2))
            expected = min(resident - keep, key=eviction.score)
            victim = eviction.victim(keep)
            assert victim == expected
            if half_life <= 1:
                assert victim == next(k for k in recency if k not in keep)
            resident.remove(victim)
            recency.pop(victim)
        resident.add(key)
        recency[key] = None
        recency.move_to_end(key)
        eviction.used(key)
    assert len(eviction._heap) <= 4 * len(resident) + 64  # stale entries are compacted away


def test_the_expert_cache_keeps_a_popular_expert_through_a_burst_of_others():
    store = ExpertStore(numbered_expert, (0, 1), 4, host_experts=8, pin=False)
    cache = ExpertCache(store, 3, torch.device("cpu"))
    for _ in range(4):
        cache.ensure(0, [0])
    cache.ensure(0, [1, 2])
    cache.ensure(1, [3])  # LRU would evict (0, 0), the least recently used
    assert cache.resident() == {(0, 0), (0, 2), (1, 3)}
    assert cache.ensure(0, [0]) and cache.stats.hits == 4
    assert cache.slot_table[0, 1] == -1 and cache.slot_table[1, 3] >= 0


def test_lowest_lists_the_lowest_scored_keys_first_and_forget_leaves_the_rest():
    policy = DecayedUseEviction(8.0)
    for key, uses in (("a", 3), ("b", 1), ("c", 2), ("d", 5)):
        for _ in range(uses):
            policy.used(key)
    assert policy.lowest(["a", "b", "c", "d"], 2) == ["b", "c"]
    assert policy.lowest(["a", "b", "c", "d"], 9) == ["b", "c", "a", "d"]
    policy.forget("b")
    assert policy.victim() == "c"  # b is no longer resident


def test_an_expert_that_moved_between_slots_since_the_last_settle_stays_resident():
    # passes without a settle between them (a graph's warm-ups) evicted A from slot 0 for C, and B from slot 1 for A
    columns = 9
    a, b, c = (0, 1), (0, 2), (1, 3)
    flat = {key: key[0] * columns + key[1] for key in (a, b, c)}
    eviction = DecayedUseEviction(half_life=1.0)
    slot_of = {a: 0, b: 1}
    for key in (a, b, c, a):  # the settle counts the passes' uses first
        eviction.used(key)
    follow_owners(slot_of, eviction, np.array([flat[a], flat[b]]), np.array([flat[c], flat[a]]), columns)
    assert slot_of == {c: 0, a: 1}
    # the policy knows both residents: with C kept, A is the victim (not C, the fallback when none is left)
    assert eviction.victim(keep={c}) == a
