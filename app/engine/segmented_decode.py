"""The decode step when routed experts are offloaded: CUDA graphs between the host's expert work.

Routing decides on the host which experts to copy, so such a step cannot be one graph (cuda_graph.py), but
everything between two layers' expert ops can. Segment i adds layer i - 1's expert output to the residual
and runs layer i up to its router (the first one also embeds the token and builds the masks and rotary
tables of its position); a last segment adds the last expert output, norms and projects. Between two
replays the host reads the routing, copies misses and runs the expert op (itself a graph, op_graph.py)
through the model's `routed_experts`, as the eager forward does: the expert cache sees the same calls in
the same order, look-ahead prefetch included.
"""

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from functools import partial

import torch

from app.engine.cuda_graph import warm_up
from app.engine.experts import ExpertCache
from app.engine.kv_cache import KVCache
from app.engine.layers import finish_forward


def segments_ready(model) -> bool:
    """A decode step can be segmented: a GPU, experts not all resident (else one graph runs the whole step,
    cuda_graph.graph_ready) in one device's cache, and a model split at its experts (`until_experts`)."""
    return (model.device.type == "cuda" and isinstance(model.experts, ExpertCache) and not model.experts.complete
            and hasattr(model, "until_experts"))


class SegmentedDecode:
    """One token after the cache's committed ones -> its logits [1, V] and, with `capture` (layer indices, see
    the model's forward), its features [1, F]. The segments write to tensors that stay the same from step to
    step, so on a GPU each is captured once (at construction) and replayed; elsewhere they simply run. The
    cache must stay the same object; the outputs are overwritten by the next step."""

    def __init__(self, model, cache: KVCache, capture: tuple[int, ...] = ()):
        self.model, self.cache, self.capture = model, cache, capture
        device = cache.device
        self.token = torch.zeros(1, dtype=torch.long, device=device)
        self.position = torch.full((1,), cache.length, dtype=torch.long, device=device)
        self.expert_output = torch.zeros(1, model.config.hidden_size, dtype=model.dtype, device=device)
        num_layers = len(model.layers)
        self.residuals: list[torch.Tensor | None] = [None] * num_layers  # [1, H] after each layer's attention
        self.routings: list = [None] * num_layers
        self.layer_outputs: dict[int, torch.Tensor] = {}  # captured layers but the last, [1, H]
        self.context = None
        self.logits: torch.Tensor | None = None
        self.features: torch.Tensor | None = None
        segments = [partial(self._layer, index) for index in range(num_layers)] + [self._finish]
        self.replays = self._captured(segments) if device.type == "cuda" else segments

    def step(self, token: int) -> torch.Tensor:
        """Feed one token after the committed ones; return its logits [V]."""
        return self.run([token])[-1]

    def run(self, tokens: list[int]) -> torch.Tensor:
        """Feed [token] after the committed ones; return its logits [1, V] (`features` holds its features)."""
        (token,) = tokens
        self.cache.check_room(1)
        self.token.fill_(token)
        self.position.fill_(self.cache.length)
        with self._static_positions():
            for index, replay in enumerate(self.replays[:-1]):
                replay()
                self.expert_output.copy_(self.model.routed_experts(index, self.routings[index]))
            self.replays[-1]()
        self.cache.advance(1)
        return self.logits

    def _layer(self, index: int) -> None:
        if index == 0:
            x = self.model.embed[self.token]
            self.context = self.model.attention_context(1, self.cache)
        else:
            x = self.residuals[index - 1] + self.expert_output
            if index - 1 in self.capture:
                self.layer_outputs[index - 1] = x
        self.residuals[index], self.routings[index] = self.model.until_experts(index, x, self.context, self.cache)

    def _finish(self) -> None:
        x = self.residuals[-1] + self.expert_output
        out = finish_forward(self.model, x, dict(self.layer_outputs), self.capture, last_only=False)
        self.logits, self.features = out if self.capture else (out, None)

    def _captured(self, segments: list[Callable[[], None]]) -> list[Callable[[], None]]:
        """Each segment as the replay of a CUDA graph captured from it. They share one memory pool: they
        always replay one after another in the order captured, and every tensor a later segment or the host
        reads stays referenced here, so a segment only reuses memory that earlier ones no longer need."""
        with self._static_positions():
            warm_up(lambda: [segment() for segment in segments], self.cache.device, self.cache)
            pool = torch.cuda.graph_pool_handle()
            graphs = []
            for segment in segments:
                graph = torch.cuda.CUDAGraph()
                with torch.cuda.graph(graph, pool=pool):
                    segment()
                graphs.append(graph)
        return [graph.replay for graph in graphs]

    @contextmanager
    def _static_positions(self) -> Iterator[None]:
        """The cache writes and attends at `self.position`, over all its rows (masked by position)."""
        self.cache.static_positions = self.position
        try:
            yield
        finally:
            self.cache.static_positions = None
