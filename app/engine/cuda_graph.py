"""Decode and verify steps captured once as CUDA graphs and replayed: no launch overhead, no host work
per layer. Only for a model whose experts are all resident (routing needs no host)."""

import torch

from app.engine.kv_cache import KVCache


def graph_ready(model) -> bool:
    """A step can be a graph: it runs on a GPU, routing needs no host work (every expert is resident)
    and neither does the model's expert op (`graph_safe`, true unless a model says otherwise)."""
    return model.device.type == "cuda" and model.experts.complete and getattr(model, "graph_safe", True)


class DecodeGraph:
    """A forward pass of `num_tokens` positions after the committed ones. Capture happens at
    construction; the cache must stay the same object for every step. With `capture` (layer indices,
    see the model's forward) each step also leaves those layers' outputs in `features` [T, F].
    Outputs are overwritten by the next replay of this graph, or of any graph sharing its `pool`."""

    def __init__(self, model, cache: KVCache, capture: tuple[int, ...] = (), num_tokens: int = 1, pool=None):
        self.cache = cache
        self.num_tokens = num_tokens
        self.tokens = torch.zeros(num_tokens, dtype=torch.long, device=cache.device)
        self.offsets = torch.arange(num_tokens, device=cache.device)
        self.positions = self.offsets + cache.length
        cache.static_positions = self.positions
        committed = cache.length
        # rows from `committed` on are not part of the context yet, so warm-up and capture may write them
        side = torch.cuda.Stream(cache.device)
        side.wait_stream(torch.cuda.current_stream(cache.device))
        with torch.cuda.stream(side), model.experts.uncounted():
            for _ in range(2):
                model.forward(self.tokens, cache, capture=capture)
                cache.truncate(committed)
        torch.cuda.current_stream(cache.device).wait_stream(side)
        self.graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(self.graph, pool=pool):
            output = model.forward(self.tokens, cache, capture=capture)
        self.logits, self.features = output if capture else (output, None)
        cache.truncate(committed)
        cache.static_positions = None  # the graph keeps reading self.positions

    def run(self, tokens: list[int]) -> torch.Tensor:
        """Feed `num_tokens` tokens after the committed ones; return their logits [T, V]."""
        self.cache.check_room(self.num_tokens)
        if self.num_tokens == 1:
            self.tokens.fill_(tokens[0])  # a kernel launch, cheaper than a copy from pageable memory
        else:
            self.tokens.copy_(torch.tensor(tokens, dtype=torch.long))
        torch.add(self.offsets, self.cache.length, out=self.positions)
        self.graph.replay()
        self.cache.advance(self.num_tokens)
        return self.logits

    def step(self, token: int) -> torch.Tensor:
        """Feed one token after the committed ones; return its logits [V]."""
        return self.run([token])[-1]
