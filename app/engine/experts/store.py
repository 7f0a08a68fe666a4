"""Every routed expert in host memory (or on disk), in checkpoint format, and the routing that picks them."""

from collections.abc import Callable
from typing import NamedTuple

import torch

from app.engine.weights.host_memory import HostArena, aligned_bytes

ExpertTensors = dict[str, torch.Tensor]
ExpertKey = tuple[int, int]  # (layer, expert)
OTHER_DEVICE = -1  # an expert id routed to another device's cache (expert_parallel.py): no slot, no copy here


class Routing(NamedTuple):
    """hidden [T, H] (normed), top_experts and top_weights [T, k], predictions {later layer: experts [T, k]};
    `shared`, the address row (expert_table.address_row) of a shared expert the routed ones' op adds, or None;
    `slots` [1, k], the picks' slots where the router looked them up (`ExpertCache.resident_lookup`), or None;
    `hidden_pairs`, hidden in float16 pairs where the norm gave them for the op (`ExpertCache.takes_hidden_pairs`),
    or None."""

    hidden: torch.Tensor
    top_experts: torch.Tensor
    top_weights: torch.Tensor
    predictions: dict[int, torch.Tensor]
    shared: torch.Tensor | None = None
    slots: torch.Tensor | None = None
    hidden_pairs: tuple[torch.Tensor, torch.Tensor] | None = None


class ExpertStore:
    """The first `host_experts` (layer order) are copied into one host allocation, page-locked for a GPU cache; the
    rest stay views of the memory-mapped checkpoint."""

    def __init__(
        self,
        read_expert: Callable[[int, int], ExpertTensors],
        layers: tuple[int, ...],
        num_experts: int,
        host_experts: int,
        pin: bool,
        on_layer: Callable[[int], None] = lambda layers_done: None,
    ):
        self.layers = layers
        self.num_experts = num_experts
        self._experts: dict[ExpertKey, ExpertTensors] = {}
        self._on_disk: set[ExpertKey] = set()
        first = read_expert(layers[0], 0)
        self.expert_bytes = sum(t.numel() * t.element_size() for t in first.values())
        self.host = HostArena(min(host_experts, len(layers) * num_experts) * aligned_bytes(first.values()), pin)
        for index, key in enumerate((layer, e) for layer in layers for e in range(num_experts)):
            tensors = read_expert(*key)
            if index < host_experts:
                tensors = {name: self.host.copy_of(t) for name, t in tensors.items()}
            else:
                self._on_disk.add(key)
            self._experts[key] = tensors
            if key[1] == num_experts - 1:
                on_layer(index // num_experts + 1)

    def expert(self, layer: int, expert: int) -> ExpertTensors:
        return self._experts[(layer, expert)]

    def is_on_disk(self, layer: int, expert: int) -> bool:
        return (layer, expert) in self._on_disk

    @property
    def all_in_host_memory(self) -> bool:
        return not self._on_disk

    def host_arenas(self) -> ExpertTensors:
        """Arenas [layers * experts, ...] over the host allocation: expert e of the i-th MoE layer is slot
        i * num_experts + e; slots lie `aligned_bytes` apart."""
        assert self.all_in_host_memory
        first = self.expert(self.layers[0], 0)
        count, spacing, start = len(self._experts), aligned_bytes(first.values()), self.host.buffer.data_ptr()
        arenas = {}
        for name, tensor in first.items():
            size = tensor.element_size()
            arenas[name] = self.host.buffer.view(tensor.dtype).as_strided(
                (count, *tensor.shape), (spacing // size, *tensor.stride()), (tensor.data_ptr() - start) // size)
        return arenas
