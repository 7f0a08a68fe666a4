"""Routed experts: an `ExpertStore` in host memory (or on disk) and an `ExpertCache` of device slots.

Experts keep their checkpoint format (MXFP4, FP8, bf16) in both places; kernels dequantize them at
compute time. On CPU the cache is still a separate arena, so the fetch mechanics run in CI too.
"""

from collections import OrderedDict
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import torch

ExpertTensors = dict[str, torch.Tensor]
ExpertKey = tuple[int, int]  # (layer, expert)


class ExpertStore:
    """Every routed expert, in checkpoint format.

    The first `host_experts` (in layer order) are copied into host memory, pinned when the cache
    lives on a GPU; the rest stay views of the memory-mapped checkpoint and are read on demand.
    """

    def __init__(
        self,
        read_expert: Callable[[int, int], ExpertTensors],
        layers: tuple[int, ...],
        num_experts: int,
        host_experts: int,
        pin: bool,
    ):
        self.layers = layers
        self.num_experts = num_experts
        self._experts: dict[ExpertKey, ExpertTensors] = {}
        self._on_disk: set[ExpertKey] = set()
        for index, key in enumerate((layer, e) for layer in layers for e in range(num_experts)):
            tensors = read_expert(*key)
            if index < host_experts:
                tensors = {name: _to_host(t, pin) for name, t in tensors.items()}
            else:
                self._on_disk.add(key)
            self._experts[key] = tensors
        first = self._experts[(layers[0], 0)]
        self.expert_bytes = sum(t.numel() * t.element_size() for t in first.values())

    def expert(self, layer: int, expert: int) -> ExpertTensors:
        return self._experts[(layer, expert)]

    def is_on_disk(self, layer: int, expert: int) -> bool:
        return (layer, expert) in self._on_disk


def _to_host(tensor: torch.Tensor, pin: bool) -> torch.Tensor:
    copy = torch.empty_like(tensor, pin_memory=pin)
    copy.copy_(tensor)
    return copy


@dataclass
class CacheStats:
    hits: int = 0
    misses: int = 0
    bytes_fetched: int = 0
    disk_reads: int = 0
    evictions: int = 0

    def as_dict(self) -> dict[str, int]:
        return dict(self.__dict__)


class ExpertCache:
    """A fixed number of device slots holding experts, evicting the least recently used."""

    def __init__(self, store: ExpertStore, num_slots: int, device: torch.device):
        template = store.expert(store.layers[0], 0)
        self.store = store
        self.num_slots = num_slots
        self.arenas = {
            name: torch.empty((num_slots, *t.shape), dtype=t.dtype, device=device) for name, t in template.items()
        }
        self._slot_of: OrderedDict[ExpertKey, int] = OrderedDict()
        self._free = list(range(num_slots - 1, -1, -1))
        self.stats = CacheStats()

    def preload(self, keys: list[ExpertKey]) -> None:
        """Fill free slots before decoding starts (not counted as misses: nothing waits for them)."""
        for key in keys[: len(self._free)]:
            self._load(key, self._free.pop())

    def ensure(self, layer: int, experts: list[int]) -> list[int]:
        """Slots holding `experts` of `layer`, fetching misses. At most `num_slots` experts at once."""
        assert len(experts) <= self.num_slots, "more experts than slots: use groups()"
        slots = []
        for expert in experts:
            key = (layer, expert)
            slot = self._slot_of.get(key)
            if slot is None:
                slot = self._free.pop() if self._free else self._evict()
                self._load(key, slot)
                self.stats.misses += 1
                self.stats.bytes_fetched += self.store.expert_bytes
                self.stats.disk_reads += self.store.is_on_disk(*key)
            else:
                self._slot_of.move_to_end(key)
                self.stats.hits += 1
            slots.append(slot)
        return slots

    def groups(self, layer: int, experts: list[int]) -> Iterator[tuple[list[int], list[int]]]:
        """(experts, slots) in groups that fit the cache, each fetched just before it is used."""
        for start in range(0, len(experts), self.num_slots):
            group = experts[start : start + self.num_slots]
            yield group, self.ensure(layer, group)

    def run(
        self,
        layer: int,
        hidden: torch.Tensor,
        top_experts: torch.Tensor,
        top_weights: torch.Tensor,
        experts_fn: Callable[..., torch.Tensor],
    ) -> torch.Tensor:
        """Weighted sum of the routed experts: hidden [T, H], top_experts/top_weights [T, k] -> [T, H].

        `experts_fn(hidden, arenas, slots, weights)` is the kernel; slot -1 marks experts that are
        not in the current group.
        """
        out = torch.zeros_like(hidden)
        slot_of = torch.full((self.store.num_experts,), -1, dtype=torch.long, device=hidden.device)
        for experts, slots in self.groups(layer, sorted(set(top_experts.flatten().tolist()))):
            slot_of.fill_(-1)
            slot_of[torch.tensor(experts, device=hidden.device)] = torch.tensor(slots, device=hidden.device)
            out += experts_fn(hidden, self.arenas, slot_of[top_experts], top_weights)
        return out

    def resident(self) -> set[ExpertKey]:
        return set(self._slot_of)

    def _evict(self) -> int:
        _, slot = self._slot_of.popitem(last=False)
        self.stats.evictions += 1
        return slot

    def _load(self, key: ExpertKey, slot: int) -> None:
        for name, tensor in self.store.expert(*key).items():
            self.arenas[name][slot].copy_(tensor, non_blocking=tensor.is_pinned())
        self._slot_of[key] = slot
