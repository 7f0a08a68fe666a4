"""The one-token decode step, captured once as a CUDA graph and replayed: no launch overhead, no
host work per layer. Only for a model whose experts are all resident (routing needs no host)."""

import torch

from app.engine.kv_cache import KVCache


class DecodeGraph:
    """Capture happens at construction; the cache must stay the same object for every step."""

    def __init__(self, model, cache: KVCache):
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
                model.forward(self.token, cache)
                cache.truncate(committed)
        torch.cuda.current_stream(cache.device).wait_stream(side)
        self.graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(self.graph):
            self.logits = model.forward(self.token, cache)
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
