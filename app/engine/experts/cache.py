"""Device slots over the routed experts of an `ExpertStore`; experts keep their checkpoint format (MXFP4, FP8,
bf16), kernels dequantize at compute time. A CPU cache with fewer slots than experts is still a separate arena, so
the fetch mechanics run in CI too.
"""

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import replace

import torch

from app.engine.experts.cache_policy import DEFAULT_HALF_LIFE_SLOTS, DecayedUseEviction
from app.engine.experts.device_misses import DEVICE_PASS_MAX_TOKENS, DeviceMisses
from app.engine.experts.op_graph import SingleTokenGraph
from app.engine.experts.store import OTHER_DEVICE, ExpertKey, ExpertStore, ExpertTensors
from app.engine.layers.read_later import ReadLater
from app.kernels.expert_op import ExpertOp
from app.kernels.pick_rows import PickRows
from app.kernels.resident_slots import resident_slots_op
from app.protocol.stats import CacheStats

PREFETCH_MAX_TOKENS = 16  # look ahead for decode and verify steps, not for prefill chunks


class ExpertCache:
    """Fixed device slots, evicting the expert of least decayed use (cache_policy.py).

    On a GPU copies run on their own stream; each slot remembers the event ending its copy (compute waits for it)
    and the one ending its last reader (the next copy into it waits). `slot_table` [layers, E + 1] maps to slots on
    the device, so a complete cache, or one serving misses on the device (device_misses.py), routes with no host
    synchronisation; `settle` between passes lets the host catch up.
    """

    def __init__(self, store: ExpertStore, num_slots: int, device: torch.device, prefetch_layers: int = 0,
                 arenas: ExpertTensors | None = None):
        template = store.expert(store.layers[0], 0)
        self.store = store
        self.num_slots = num_slots
        self.prefetch_layers = prefetch_layers
        self.device = device
        self.arenas = arenas or {
            name: torch.empty((num_slots, *t.shape), dtype=t.dtype, device=device) for name, t in template.items()
        }
        # the extra last column stays -1: OTHER_DEVICE indexes it, so such picks get no slot
        self.slot_table = torch.full((max(store.layers) + 1, store.num_experts + 1), -1, dtype=torch.long,
                                     device=device)
        self.complete = False
        self.device_misses: DeviceMisses | None = None
        self.slot_of: dict[ExpertKey, int] = {}  # the host's view of the slots
        self.eviction = DecayedUseEviction(DEFAULT_HALF_LIFE_SLOTS * num_slots)
        self.free_slots = list(range(num_slots - 1, -1, -1))
        self._predicted: dict[int, set[int]] = {}
        self._copy_stream = torch.cuda.Stream(device) if device.type == "cuda" else None
        self._copied: dict[int, torch.cuda.Event] = {}
        self._released: dict[int, torch.cuda.Event] = {}
        self._resident_uses = torch.zeros((), dtype=torch.long, device=device)
        self._resident_slots = resident_slots_op(device)
        self._single_token_graphs: dict[tuple, SingleTokenGraph] = {}
        self.stats = CacheStats()

    @classmethod
    def over_host_store(cls, store: ExpertStore, prefetch_layers: int = 0) -> "ExpertCache":
        """CPU, every expert in host memory: the slots are the store's experts in place (no second copy in RAM)."""
        count = len(store.layers) * store.num_experts
        cache = cls(store, count, torch.device("cpu"), prefetch_layers, arenas=store.host_arenas())
        slots = torch.arange(count).view(len(store.layers), store.num_experts)
        cache.slot_table[torch.tensor(store.layers), : store.num_experts] = slots
        cache.slot_of = {(layer, expert): int(slots[i, expert]) for i, layer in enumerate(store.layers)
                         for expert in range(store.num_experts)}
        cache.free_slots = []
        cache.complete = True
        return cache

    def preload(self, keys: list[ExpertKey]) -> None:
        """Fill free slots before decoding (not counted as misses: nothing waits for them)."""
        for key in keys[: len(self.free_slots)]:
            self._load(key, self.free_slots.pop())
        if self._copy_stream is not None:
            self._copy_stream.synchronize()
            self._copied.clear()
        self.complete = len(self.slot_of) == len(self.store.layers) * self.store.num_experts

    def serve_misses_on_device(self, top_k: int) -> None:
        assert self.store.all_in_host_memory and not self.complete
        self.device_misses = DeviceMisses(self, top_k)

    @property
    def host_free_passes(self) -> bool:
        return self.complete or self.device_misses is not None

    def settle(self) -> None:
        if self.device_misses is None:
            return
        if self._copy_stream is not None:  # a prefill chunk's copies wait for the passes before
            self._copy_stream.wait_stream(torch.cuda.current_stream(self.device))
        self.device_misses.settle()

    def ensure(self, layer: int, experts: list[int]) -> list[int]:
        assert len(experts) <= self.num_slots, "more experts than slots: use groups()"
        slots = []
        keep = {(layer, expert) for expert in experts}  # no expert of this call evicts another
        for expert in experts:
            key = (layer, expert)
            slot = self.slot_of.get(key)
            if slot is None:
                slot = self._take_slot(keep)
                self._load(key, slot)
                self.stats.misses += 1
                self.stats.bytes_fetched += self.store.expert_bytes
                self.stats.disk_reads += self.store.is_on_disk(*key)
            else:
                self.eviction.used(key)
                self.stats.hits += 1
            slots.append(slot)
        return slots

    def prefetch(self, layer: int, experts: list[int]) -> None:
        """Start copying a later layer's predicted experts; predictions for one run of a layer are joined."""
        self._predicted.setdefault(layer, set()).update(experts)
        keep = {(layer, expert) for expert in experts}
        for expert in experts:
            key = (layer, expert)
            if key in self.slot_of:
                continue
            self._load(key, self._take_slot(keep))
            self.stats.prefetches += 1
            self.stats.bytes_fetched += self.store.expert_bytes
            self.stats.disk_reads += self.store.is_on_disk(*key)

    def lookahead_layers(self, layer: int | None, num_tokens: int) -> tuple[int, ...]:
        """MoE layers to predict now: the next after `layer`, or the first ones before a pass (`layer` None)."""
        if self.host_free_passes or num_tokens > PREFETCH_MAX_TOKENS:
            return ()
        start = 0 if layer is None else self.store.layers.index(layer) + 1
        return self.store.layers[start : start + self.prefetch_layers]

    def takes_shared(self, experts_fn: ExpertOp, num_tokens: int) -> bool:
        """Whether `run` can add a shared expert to these tokens' picks: the op can, and every expert is resident
        (its one launch then needs no copies waited for nor slots resolved on the host)."""
        return self.complete and experts_fn.takes_shared(num_tokens, self.arenas)

    def takes_hidden_pairs(self, experts_fn: ExpertOp, num_pairs: int, dtype: torch.dtype) -> bool:
        """Whether `run` can take that many (token, pick) pairs' hidden states in float16 pairs from the norm that
        made them (norms.add_rms_norm_half_pairs): the op reads them so, and every expert is resident (its launch
        then comes straight from the router's)."""
        return self.complete and experts_fn.takes_hidden_pairs(num_pairs, dtype, self.arenas)

    def resident_lookup(self, layer: int, num_tokens: int) -> tuple[torch.Tensor, torch.Tensor] | None:
        """Where every expert is resident, what a router needs to look one token's slots up in its own launch
        (sigmoid_router.sigmoid_router_slots): this layer's slot row [E + 1] and the uses counter; else None."""
        if not self.complete or num_tokens != 1:
            return None
        return self.slot_table[layer], self._resident_uses

    def groups(self, layer: int, experts: list[int]) -> Iterator[tuple[list[int], list[int]]]:
        for start in range(0, len(experts), self.num_slots):
            group = experts[start : start + self.num_slots]
            yield group, self.ensure(layer, group)

    def run(
        self,
        layer: int,
        hidden: torch.Tensor,
        top_experts: torch.Tensor,
        top_weights: torch.Tensor,
        experts_fn: ExpertOp,
        predictions: dict[int, torch.Tensor] | None = None,
        shared: torch.Tensor | None = None,
        slots: torch.Tensor | None = None,
        hidden_pairs: tuple[torch.Tensor, torch.Tensor] | None = None,
    ) -> torch.Tensor | PickRows:
        """hidden [T, H], top_experts/top_weights [T, k] -> [T, H]; slot -1 marks experts outside the current group.
        `predictions` maps later layers to experts [N]; their copies start once this layer's kernel is queued.
        `shared`, a shared expert's address row the op adds, where `takes_shared`; `slots`, the picks' slots where
        the router looked them up (`resident_lookup`); `hidden_pairs`, hidden in float16 pairs, where
        `takes_hidden_pairs`: then the op's picks unsummed (pick_rows.PickRows), for the next norm to add."""
        if self.complete:
            if slots is None:
                slots = self._slots_of_resident(layer, top_experts)
            return experts_fn(hidden, self.arenas, slots, top_weights, shared=shared, hidden_pairs=hidden_pairs)
        assert slots is None, "only a complete cache's slots are looked up by the router (resident_lookup)"
        assert shared is None, "only a complete cache's op adds the shared expert (takes_shared)"
        assert hidden_pairs is None, "only a complete cache's op takes hidden in float16 pairs (takes_hidden_pairs)"
        if self.device_misses is not None and len(hidden) <= DEVICE_PASS_MAX_TOKENS:
            return self.device_misses.run(layer, hidden, top_experts, top_weights, experts_fn)
        layers = sorted(predictions or {})
        # one host synchronisation for this layer's routing and the look-ahead predictions
        wanted = torch.cat([top_experts.flatten(), *(predictions[later].flatten() for later in layers)]).tolist()
        used = sorted(set(wanted[: top_experts.numel()]) - {OTHER_DEVICE})
        self._score_prediction(layer, used)
        if len(used) <= self.num_slots:
            slots = self.ensure(layer, used)
            self._wait_for_copies(slots)
            out = self._call(experts_fn, hidden, self.slot_table[layer][top_experts], top_weights)
            self._mark_released(slots)
        else:
            out = self._run_in_groups(layer, used, hidden, top_experts, top_weights, experts_fn)
        offset = top_experts.numel()
        for later in layers:
            count = predictions[later].numel()
            self.prefetch(later, sorted(set(wanted[offset : offset + count]) - {OTHER_DEVICE}))
            offset += count
        return out

    def _run_in_groups(self, layer, used, hidden, top_experts, top_weights, experts_fn) -> torch.Tensor:
        out = torch.zeros_like(hidden)
        slot_of = torch.full((self.store.num_experts + 1,), -1, dtype=torch.long, device=hidden.device)
        for experts, slots in self.groups(layer, used):
            self._wait_for_copies(slots)
            slot_of.fill_(-1)
            slot_of[torch.tensor(experts, device=hidden.device)] = torch.tensor(slots, device=hidden.device)
            out += experts_fn(hidden, self.arenas, slot_of[top_experts], top_weights)
            self._mark_released(slots)
        return out

    def _call(self, experts_fn, hidden, slots, weights) -> torch.Tensor:
        if len(hidden) != 1 or not experts_fn.capturable:
            return experts_fn(hidden, self.arenas, slots, weights)
        key = (id(experts_fn), slots.shape[1], hidden.dtype, weights.dtype)
        if key not in self._single_token_graphs:
            self._single_token_graphs[key] = SingleTokenGraph(experts_fn, self.arenas, hidden, slots, weights)
        return self._single_token_graphs[key](hidden, slots, weights)

    def resident(self) -> set[ExpertKey]:
        return set(self.slot_of)

    @contextmanager
    def uncounted(self) -> Iterator[None]:
        saved_stats, saved_uses = replace(self.stats), self._resident_uses.clone()
        yield
        self.settle()
        self.stats = saved_stats
        self._resident_uses.copy_(saved_uses)

    def snapshot(self) -> CacheStats:
        if self.complete:
            self.stats.hits = int(self._resident_uses)
        return replace(self.stats)

    def snapshot_later(self) -> Callable[[], CacheStats]:
        """A complete cache's snapshot as of the passes queued so far, read when called: it waits for those passes,
        not for the ones queued after (a complete cache counts its hits on the device alone)."""
        assert self.complete, "an incomplete cache's counts change on the host: snapshot between passes"
        uses, stats = ReadLater(self._resident_uses), replace(self.stats)
        return lambda: replace(stats, hits=int(uses.read()))

    def _slots_of_resident(self, layer: int, top_experts: torch.Tensor) -> torch.Tensor:
        if len(top_experts) == 1:  # one token's top-k are distinct experts: only OTHER_DEVICE (no slot) repeats
            return self._resident_slots(self.slot_table[layer], top_experts, self._resident_uses)
        used = torch.zeros(self.store.num_experts + 1, dtype=torch.long, device=top_experts.device)
        self._resident_uses += used.index_fill_(0, top_experts.flatten(), 1)[:-1].sum()  # OTHER_DEVICE is last
        return self.slot_table[layer][top_experts]

    def _score_prediction(self, layer: int, used: list[int]) -> None:
        predicted = self._predicted.pop(layer, None)
        if predicted is not None:
            self.stats.predicted += len(predicted)
            self.stats.predicted_used += len(predicted.intersection(used))
            self.stats.used_after_prediction += len(used)

    def _take_slot(self, keep: set[ExpertKey]) -> int:
        if self.free_slots:
            return self.free_slots.pop()
        key = self.eviction.victim(keep)
        slot = self.slot_of.pop(key)
        self.slot_table[key] = -1
        if self.device_misses is not None:
            self.device_misses.slot_loaded(slot, None)
        self.stats.evictions += 1
        return slot

    def _load(self, key: ExpertKey, slot: int) -> None:
        source = self.store.expert(*key)
        if self._copy_stream is None:
            for name, tensor in source.items():
                self.arenas[name][slot].copy_(tensor)
        else:
            released = self._released.pop(slot, None)
            if released is not None:
                self._copy_stream.wait_event(released)
            with torch.cuda.stream(self._copy_stream):
                for name, tensor in source.items():
                    self.arenas[name][slot].copy_(tensor, non_blocking=True)
                self._copied[slot] = torch.cuda.Event()
                self._copied[slot].record()
        self.slot_of[key] = slot
        self.slot_table[key] = slot
        if self.device_misses is not None:
            self.device_misses.slot_loaded(slot, key)
        self.eviction.used(key)

    def _wait_for_copies(self, slots: list[int]) -> None:
        for slot in slots:
            copied = self._copied.pop(slot, None)
            if copied is not None:
                torch.cuda.current_stream(self.device).wait_event(copied)

    def _mark_released(self, slots: list[int]) -> None:
        if self._copy_stream is not None:
            released = torch.cuda.Event()
            released.record()
            for slot in slots:
                self._released[slot] = released
