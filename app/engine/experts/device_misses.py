"""Misses served by the device: with every expert in page-locked host memory, a pass needs no host work per layer.

Each MoE layer resolves its picks on the device into an address table (app/kernels/expert_resolve.py), one copy
kernel fetches admitted misses into victim slots (expert_fetch.py), the expert kernels read where the table points.
`settle`, between passes, reads what the device did in one transfer, scores the eviction policy and refills the
victim queue (free slots, then the lowest-scored), so the policy decides what stays off the critical path. With a
CPU tier (cpu_tier.py) the host's cores compute part of each call's misses, which are then neither fetched nor
admitted.
"""

import numpy as np
import torch

from app.engine.experts.cache_policy import DecayedUseEviction
from app.engine.experts.cpu_tier import CpuTier
from app.kernels.cpu_share import CPU_COMPUTED
from app.kernels.expert_fetch import fetch_experts
from app.kernels.expert_resolve import EVICTED, HITS, MISSES, Residency, resolve_experts
from app.kernels.expert_table import columns, device_addresses, slot_table

DEVICE_PASS_MAX_TOKENS = 16  # decode steps and verify blocks; the host copies a prefill chunk's misses


class DeviceMisses:
    """The device-side residency of an `ExpertCache` (`cache`) and the host's view of it."""

    def __init__(self, cache, top_k: int):
        store, device = cache.store, cache.device
        self.cache = cache
        self.num_experts = store.num_experts
        self.first_layer = store.layers[0]
        names = columns(cache.arenas)
        num_layers, num_slots = cache.slot_table.shape[0], cache.num_slots
        buffer = store.host.buffer
        base = device_addresses([buffer], device)[0] - buffer.data_ptr()
        host_rows = torch.zeros(num_layers, self.num_experts, len(names), dtype=torch.long)
        for layer in store.layers:
            for expert in range(self.num_experts):
                tensors = store.expert(layer, expert)
                host_rows[layer, expert] = torch.tensor([base + tensors[name].data_ptr() for name in names])
        # victims for a pass in which every MoE layer misses twice its top-k
        self.queue_length = min(num_slots, 2 * top_k * len(store.layers))
        self.residency = Residency(
            slot_of=cache.slot_table,
            owner=torch.full((num_slots,), -1, dtype=torch.long, device=device),
            stamp=torch.zeros(num_slots, dtype=torch.long, device=device),
            pass_number=torch.zeros(1, dtype=torch.long, device=device),
            victims=torch.zeros(2 + self.queue_length, dtype=torch.long, device=device),
            host_rows=host_rows.to(device),
            slot_rows=slot_table(cache.arenas),
            uses=torch.zeros(num_layers, self.num_experts, dtype=torch.int32, device=device),
            counts=torch.zeros(5, dtype=torch.long, device=device),  # HITS, MISSES, ADMITTED, EVICTED, CPU_COMPUTED
        )
        # [E, C]: where the expert kernels read each expert, and where an admitted miss is fetched from
        self.reads, self.sources = (torch.zeros(self.num_experts, len(names), dtype=torch.long, device=device)
                                    for _ in range(2))
        sizes = [t.numel() * t.element_size() for t in store.expert(store.layers[0], 0).values()]
        self.column_bytes = torch.tensor(sizes, dtype=torch.long, device=device)
        self.largest_column = max(sizes)
        self._owners = np.full(num_slots, -1)  # the owners at the last settle
        self._queue = torch.zeros(2 + self.queue_length, dtype=torch.long, pin_memory=device.type == "cuda")
        self.cpu_tier: CpuTier | None = None
        self.settle()

    def run(self, layer: int, hidden: torch.Tensor, top_experts: torch.Tensor, top_weights: torch.Tensor,
            op) -> torch.Tensor:
        """-> [T, H], with no host work."""
        picks = top_experts.flatten()
        if self.cpu_tier is not None:
            picks = self.cpu_tier.post(layer, hidden, picks, top_weights.flatten(), self.residency)
        fetched = resolve_experts(picks, layer, layer == self.first_layer, self.residency, self.reads, self.sources)
        fetch_experts(fetched, self.sources, self.reads, self.column_bytes, self.largest_column)
        out = op.from_table(hidden, self.cache.arenas, self.reads, picks.view_as(top_experts), top_weights)
        if self.cpu_tier is not None:
            self.cpu_tier.add(out)
        return out

    def slot_loaded(self, slot: int, key: tuple[int, int] | None) -> None:
        """The host put expert `key` in `slot` (None: emptied it) on the copy path of a prefill chunk."""
        flat = -1 if key is None else key[0] * (self.num_experts + 1) + key[1]
        self.residency.owner[slot] = flat
        self._owners[slot] = flat  # the host's view has it already

    def settle(self) -> None:
        cache, r, tier = self.cache, self.residency, self.cpu_tier
        read = [r.counts, r.uses.flatten().long(), r.owner, *([tier.buffers.failed] if tier is not None else [])]
        counts, uses, owners, *failed = torch.cat(read).cpu().split([t.numel() for t in read])
        if tier is not None:
            tier.check(bool(failed[0]))
        r.counts.zero_()
        r.uses.zero_()
        stats = cache.stats
        stats.hits += int(counts[HITS])
        stats.misses += int(counts[MISSES])
        stats.cpu_computed += int(counts[CPU_COMPUTED])
        stats.bytes_fetched += int(counts[MISSES] - counts[CPU_COMPUTED]) * cache.store.expert_bytes
        stats.evictions += int(counts[EVICTED])
        eviction: DecayedUseEviction = cache.eviction
        used = [divmod(flat, self.num_experts) for flat in uses.nonzero().flatten().tolist()]
        for key in used:
            for _ in range(int(uses[key[0] * self.num_experts + key[1]])):
                eviction.used(key)
        owners = owners.numpy()
        follow_owners(cache.slot_of, eviction, self._owners, owners, self.num_experts + 1)
        self._owners = owners
        for key in used:  # a miss the queue had no slot for: used, but not resident
            if key not in cache.slot_of:
                eviction.forget(key)
        free = np.nonzero(owners < 0)[0].tolist()
        cache.free_slots[:] = free[::-1]  # taken from the end
        lowest = eviction.lowest(list(cache.slot_of), self.queue_length - min(len(free), self.queue_length))
        queue = (free + [cache.slot_of[key] for key in lowest])[: self.queue_length]
        self._queue[0], self._queue[1] = 0, len(queue)
        self._queue[2 : 2 + len(queue)] = torch.tensor(queue, dtype=torch.long)
        r.victims.copy_(self._queue, non_blocking=True)


def follow_owners(slot_of: dict[tuple[int, int], int], eviction: DecayedUseEviction, before: np.ndarray,
                  after: np.ndarray, columns: int) -> None:
    """The host's view `slot_of` (layer, expert) -> slot, and the policy's residents, follow the device's slot
    owners from `before` [S] to `after` [S] (flat layer * columns + expert, -1 free). Between two settles an expert
    can leave one slot and enter another (passes without a settle between them: a graph's warm-ups); it stays
    resident, so the policy forgets only the experts left in no slot."""
    changed = np.nonzero(after != before)[0].tolist()
    left = []
    for slot in changed:
        if before[slot] >= 0:
            key = divmod(int(before[slot]), columns)
            if slot_of.get(key) == slot:
                del slot_of[key]
                left.append(key)
    for slot in changed:
        if after[slot] >= 0:
            slot_of[divmod(int(after[slot]), columns)] = slot
    for key in left:
        if key not in slot_of:
            eviction.forget(key)
