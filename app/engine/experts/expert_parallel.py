"""Expert parallel: every (layer, expert) has one owner device, whose own `ExpertCache` over the one host store
holds or fetches it, so the cache grows with every device and misses are copied over several links at once. Each
device runs the expert op on its own picks (the others are `OTHER_DEVICE` there); the first sums the outputs.
"""

from collections.abc import Callable, Iterator, Sequence
from contextlib import ExitStack, contextmanager, nullcontext
from dataclasses import replace

import torch

from app.engine.experts.cache import ExpertCache
from app.engine.experts.store import OTHER_DEVICE, ExpertKey, ExpertStore
from app.protocol.stats import CacheStats


def assign_owners(layers: Sequence[int], num_experts: int, slots: Sequence[int]) -> dict[ExpertKey, int]:
    """Shares proportional to the devices' slots, interleaved within every layer so uniform routing loads the
    devices in proportion too."""
    owned = [0] * len(slots)
    owners = {}
    for key in ((layer, expert) for layer in layers for expert in range(num_experts)):
        # the D'Hondt rule: the device whose share is furthest below its slots (ties: the first)
        device = min(range(len(slots)), key=lambda i: (owned[i] + 1) / slots[i])
        owners[key] = device
        owned[device] += 1
    return owners


def _on(device: torch.device):
    """Triton kernels, CUDA events and graphs use the current device."""
    return torch.cuda.device(device) if device.type == "cuda" else nullcontext()


class ExpertParallelCache:
    """The `ExpertCache` interface over one cache per device (`devices[0]` holds the dense layers). `complete`
    stays False: a multi-device step is not one CUDA graph, and a device whose experts all fit skips host work."""

    complete = False
    host_free_passes = False

    def __init__(self, store: ExpertStore, slots: Sequence[int], devices: Sequence[torch.device],
                 prefetch_layers: int = 0):
        assert len(slots) == len(devices) > 1 and min(slots) > 0, (slots, devices)
        self.store = store
        self.device = devices[0]
        self.shards = [ExpertCache(store, count, device, prefetch_layers)
                       for count, device in zip(slots, devices, strict=True)]
        self.arenas = self.shards[0].arenas  # models find the device of their dense layers here
        self._owner_of = assign_owners(store.layers, store.num_experts, slots)
        self.owner = torch.full((max(store.layers) + 1, store.num_experts), -1, dtype=torch.long)
        for (layer, expert), device in self._owner_of.items():
            self.owner[layer, expert] = device
        self.owner = self.owner.to(self.device)

    def owned(self, device: int) -> list[ExpertKey]:
        return [key for key, owner in self._owner_of.items() if owner == device]

    def preload_owned(self) -> None:
        """Fill every device whose owned experts all fit; its routing then needs no host work."""
        for index, shard in enumerate(self.shards):
            keys = self.owned(index)
            if len(keys) <= shard.num_slots:
                shard.preload(keys)
                shard.complete = True  # every expert this device is asked for is resident

    def run(
        self,
        layer: int,
        hidden: torch.Tensor,
        top_experts: torch.Tensor,
        top_weights: torch.Tensor,
        experts_fn: Callable[..., torch.Tensor],
        predictions: dict[int, torch.Tensor] | None = None,
        shared: torch.Tensor | None = None,
        slots: torch.Tensor | None = None,
        hidden_pairs: tuple[torch.Tensor, torch.Tensor] | None = None,
    ) -> torch.Tensor:
        """`ExpertCache.run`, the result [T, H] on the first device."""
        assert shared is None, "the shared expert runs beside experts split over devices (takes_shared)"
        assert hidden_pairs is None, "hidden goes to every device as it is (takes_hidden_pairs)"
        assert slots is None, "each device looks its own slots up (resident_lookup)"
        predictions = predictions or {}
        owners = self.owner[layer][top_experts]
        later_owners = {later: self.owner[later][experts] for later, experts in predictions.items()}
        parts = {}
        # the other devices first: their routing reaches them, then their copies and kernels are queued
        # before the first device's, so all of them work at once
        for index in [*range(1, len(self.shards)), 0]:
            shard = self.shards[index]

            def mine(experts: torch.Tensor, owner: torch.Tensor, index=index, shard=shard) -> torch.Tensor:
                return torch.where(owner == index, experts, OTHER_DEVICE).to(shard.device, non_blocking=True)

            # the op's CUDA graphs are captured on the first device only (op_graph's capture stream is shared)
            op = experts_fn if index == 0 else replace(experts_fn, capturable=False)
            with _on(shard.device):
                parts[index] = shard.run(
                    layer, hidden.to(shard.device, non_blocking=True), mine(top_experts, owners),
                    top_weights.to(shard.device, non_blocking=True), op,
                    {later: mine(experts, later_owners[later]) for later, experts in predictions.items()},
                )
        out = parts[0]
        for index in range(1, len(self.shards)):
            out = out + parts[index].to(self.device, non_blocking=True)
        return out

    def takes_shared(self, experts_fn: Callable[..., torch.Tensor], num_tokens: int) -> bool:
        return False  # each device's op runs its own picks: the shared expert keeps its own launches

    def takes_hidden_pairs(self, experts_fn: Callable[..., torch.Tensor], num_pairs: int, dtype: torch.dtype) -> bool:
        return False  # hidden goes to every device as it is

    def resident_lookup(self, layer: int, num_tokens: int) -> None:
        return None  # picks are split over devices first

    def prefetch(self, layer: int, experts: list[int]) -> None:
        """Every device records the prediction, empty ones too, so coverage adds up over the devices."""
        for index, shard in enumerate(self.shards):
            with _on(shard.device):
                shard.prefetch(layer, [e for e in experts if self._owner_of[(layer, e)] == index])

    def lookahead_layers(self, layer: int | None, num_tokens: int) -> tuple[int, ...]:
        return next((shard.lookahead_layers(layer, num_tokens) for shard in self.shards if not shard.complete), ())

    def resident(self) -> set[ExpertKey]:
        return set().union(*(shard.resident() for shard in self.shards))

    def settle(self) -> None:
        for shard in self.shards:
            shard.settle()

    @contextmanager
    def uncounted(self) -> Iterator[None]:
        with ExitStack() as stack:
            for shard in self.shards:
                stack.enter_context(shard.uncounted())
            yield

    def snapshot(self) -> CacheStats:
        total = CacheStats()
        for shard in self.shards:
            total = total.plus(shard.snapshot())
        return total
