"""Which expert the cache evicts: the resident one with the least decayed use (LRFU).

Each use adds a weight that halves every `half_life` cache uses: trained routers favour some experts, and a
popular expert unused for a few tokens is worth more than one used once a moment ago, which LRU gets backwards
(half-life ≤ 1 is exactly LRU, a long one approaches LFU). Evicted experts keep their scores. Scores are
log2 of sum(2 ** (use_tick / half_life)), so they never re-decay; a heap finds the victim in O(log n).
"""

import heapq
import math
from collections.abc import Collection, Hashable

import numpy as np

# Chosen by replaying the demo model's real routing (tools/demo/routing.py; half-lives of 0.25 to 64 ×
# slots tried): 4 × slots did best at 8 and 12 of 16 experts per layer cached. Where the cache holds little
# more than one token's experts, LRU stays ahead (evaluation.json records both).
DEFAULT_HALF_LIFE_SLOTS = 4.0  # × the cache's slots, in uses
LRU_HALF_LIFE = 1.0  # one newer use outweighs all older ones: exactly LRU, to compare with


class DecayedUseEviction:
    def __init__(self, half_life: float):
        assert half_life > 0, half_life
        self.half_life = half_life
        self._tick = 0
        self._score: dict[Hashable, float] = {}  # every expert ever used
        self._resident: set[Hashable] = set()
        self._heap: list[tuple[float, int, Hashable]] = []  # (score, tick, key) of resident experts; stale ones too

    def used(self, key: Hashable) -> None:
        """A hit or a load into a slot."""
        self._tick += 1
        now = self._tick / self.half_life
        old = self._score.get(key)
        score = now if old is None else max(old, now) + math.log2(1 + 2 ** -abs(old - now))
        self._score[key] = score
        self._resident.add(key)
        heapq.heappush(self._heap, (score, self._tick, key))
        if len(self._heap) > 4 * len(self._resident) + 64:
            self._compact()

    def victim(self, keep: Collection[Hashable] = ()) -> Hashable:
        """Remove and return the lowest-scored resident not in `keep` (of `keep` if all are: a prefetch of more
        experts than slots)."""
        kept = []
        try:
            while self._heap:
                entry = heapq.heappop(self._heap)
                score, _, key = entry
                if key not in self._resident or self._score[key] != score:
                    continue  # stale: evicted since, or used again (a newer entry exists)
                if key in keep:
                    kept.append(entry)
                    continue
                self._resident.discard(key)
                return key
            key = kept.pop(0)[2]
            self._resident.discard(key)
            return key
        finally:
            for entry in kept:
                heapq.heappush(self._heap, entry)

    def forget(self, key: Hashable) -> None:
        """`key` left the cache without being chosen here (the device chose it: expert_resolve.py)."""
        self._resident.discard(key)

    def lowest(self, keys: Collection[Hashable], count: int) -> list[Hashable]:
        keys = list(keys)
        scores = np.fromiter(map(self._score.__getitem__, keys), dtype=np.float64, count=len(keys))
        chosen = np.argpartition(scores, count)[:count] if count < len(keys) else np.arange(len(keys))
        return [keys[i] for i in chosen[np.argsort(scores[chosen], kind="stable")]]

    def score(self, key: Hashable) -> float:
        """log2 of the decayed use count, in units of the current tick's weight."""
        return self._score[key] - self._tick / self.half_life

    def _compact(self) -> None:
        latest = {key: entry for entry in self._heap if (key := entry[2]) in self._resident
                  and self._score[key] == entry[0]}
        self._heap = list(latest.values())
        heapq.heapify(self._heap)
