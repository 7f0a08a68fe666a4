"""The one-token decode step, captured once as a CUDA graph and replayed: no launch overhead, no
host work per layer. Only for a model whose experts are all resident (routing needs no host)."""

import torch

from app.engine.kv_cache import KVCache


def graph_ready(model) -> bool:
    """A one-token step can be a graph: it runs on a GPU, routing needs no host work (every expert is
    resident) and neither does the model's expert op (`graph_safe`, true unless a model says otherwise)."""
    return model.device.type == "cuda" and model.experts.complete and getattr(model, "graph_safe", True)


class DecodeGraph:
    """Capture happens at construction; the cache must stay the same object for every step. With
    `capture` (layer indices, see the model's forward) each step also leaves those layers' outputs in
    `features` [1, F], overwritten by the next step."""

    def __init__(self, model, cache: KVCache, capture: tuple[int, ...] = ()):
        self.cache = cache
        self.token = torch.zeros(1, dtype=torch.long, device=cache.device)
        self.position = torch.full((1,), cache.length, dtype=torch.long, device=cache.device)
        cache.static_positions = self.position
        committed = cache.length
        # rows at `committed` are not part of the context yet, so warm-up and capture may write them
        side = torch.cuda.Stream(cache.device)
        side.wait_stream(torch.cuda.current_stream(cache.device))
        with torch.cuda.stream(side), model.experts.uncounted():
            for _ in range(2):
                model.forward(self.token, cache, capture=capture)
                cache.truncate(committed)
        torch.cuda.current_stream(cache.device).wait_stream(side)
        self.graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(self.graph):
            output = model.forward(self.token, cache, capture=capture)
        self.logits, self.features = output if capture else (output, None)
        cache.truncate(committed)
        cache.static_positions = None  # the graph keeps reading self.position

    def step(self, token: int) -> torch.Tensor:
        """Feed one token after the committed ones; return its logits [V]."""
        self.cache.check_room(1)
        self.token.fill_(token)
        self.position.fill_(self.cache.length)
        self.graph.replay()
        self.cache.advance(1)
        return self.logits[-1]
