"""Passes over a KV cache captured once as CUDA graphs and replayed: no launch overhead, no host work per layer."""

from collections.abc import Callable

import torch

from app.engine.layers.graph_capture import warm_up
from app.engine.layers.kv_cache import KVCache


def graph_ready(model) -> bool:
    """A GPU, and experts that need no host work (all resident, or misses served on the device)."""
    return model.device.type == "cuda" and model.experts.host_free_passes


class PassGraph:
    """`run(inputs)` for inputs shaped like `example` [T, ...]. The cache must stay the same object; a replay
    commits `advance` rows; the next replay of any graph sharing `pool` overwrites the output."""

    def __init__(self, run: Callable[[torch.Tensor], object], cache: KVCache, example: torch.Tensor, advance: int,
                 pool=None):
        self.cache = cache
        self.advance = advance
        self.inputs = example.clone()
        self.offsets = torch.arange(len(example), device=cache.device)
        self.positions = self.offsets + cache.length
        cache.static_positions = self.positions
        committed = cache.length
        warm_up(lambda: run(self.inputs), cache.device, cache)
        self.graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(self.graph, pool=pool):
            self.output = run(self.inputs)
        cache.truncate(committed)
        cache.static_positions = None  # the graph keeps reading self.positions

    def __call__(self, inputs: torch.Tensor) -> object:
        self.cache.check_room(len(self.inputs))
        self.inputs.copy_(inputs)
        torch.add(self.offsets, self.cache.length, out=self.positions)
        self.graph.replay()
        self.cache.advance(self.advance)
        return self.output


class DecodeGraph:
    """The target's forward over `num_tokens` positions; with `capture`, features [T, F] in `features`."""

    def __init__(self, model, cache: KVCache, capture: tuple[int, ...] = (), num_tokens: int = 1, pool=None):
        self.device = cache.device
        tokens = torch.zeros(num_tokens, dtype=torch.long, device=cache.device)
        with model.experts.uncounted():
            self.graph = PassGraph(lambda ids: model.forward(ids, cache, capture=capture), cache, tokens, num_tokens,
                                   pool)
        self.logits, self.features = self.graph.output if capture else (self.graph.output, None)

    def run(self, tokens: list[int]) -> torch.Tensor:
        return self.run_on_device(torch.tensor(tokens, dtype=torch.long).to(self.device, non_blocking=True))

    def run_on_device(self, tokens: torch.Tensor) -> torch.Tensor:
        self.graph(tokens)
        return self.logits

    def step(self, token: int) -> torch.Tensor:
        return self.run([token])[-1]
