"""The decode step when routed experts are offloaded: CUDA graphs between the host's expert work.

Routing decides on the host which experts to copy, so the step cannot be one graph (cuda_graph.py), but what lies
between two layers' expert ops can: segment i adds the i-th expert layer's output (in the next layer's input norm)
and runs up to the next router (dense layers whole); the first also embeds, the last norms and projects. Between
replays the host runs the model's `routed_experts` as the eager forward does, so the expert cache sees the same
calls in the same order.
"""

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from functools import partial

import torch

from app.engine.experts.cache import ExpertCache
from app.engine.experts.store import Routing
from app.engine.layers.graph_capture import warm_up
from app.engine.layers.kv_cache import KVCache


def segments_ready(model) -> bool:
    """A GPU, experts in one device's cache that need the host (else cuda_graph.graph_ready: one graph)."""
    return (model.device.type == "cuda" and isinstance(model.experts, ExpertCache)
            and not model.experts.host_free_passes)


class SegmentedDecode:
    """One token -> logits [1, V] and, with `capture`, features [1, F]. Segments write to static tensors, so on a
    GPU each is captured once and replayed. The cache must stay the same object; the next step overwrites outputs."""

    def __init__(self, model, cache: KVCache, capture: tuple[int, ...] = ()):
        self.model, self.cache, self.capture = model, cache, capture
        device = cache.device
        self.token = torch.zeros(1, dtype=torch.long, device=device)
        self.position = torch.full((1,), cache.length, dtype=torch.long, device=device)
        self.expert_output = torch.zeros(1, model.config.hidden_size, dtype=model.dtype, device=device)
        num_layers = len(model.layers)
        # the layers whose routed experts run on the host between two segments
        self.expert_layers = [index for index in model.experts.store.layers if index < num_layers]
        self.residuals: dict[int, torch.Tensor] = {}  # [1, H] per expert layer: its output but the routed experts
        self.routings: dict[int, Routing] = {}
        self.layer_outputs: dict[int, torch.Tensor] = {}  # captured layers but the last, [1, H]
        self.context = None
        self.logits: torch.Tensor | None = None
        self.features: torch.Tensor | None = None
        segments = [partial(self._segment, number) for number in range(len(self.expert_layers) + 1)]
        self.replays = self._captured(segments) if device.type == "cuda" else segments

    def step(self, token: int) -> torch.Tensor:
        return self.run([token])[-1]

    def run(self, tokens: list[int]) -> torch.Tensor:
        """-> logits [1, V]; `features` holds its features."""
        (token,) = tokens
        self.cache.check_room(1)
        self.token.fill_(token)
        self.position.fill_(self.cache.length)
        with self._static_positions():
            for replay, index in zip(self.replays[:-1], self.expert_layers, strict=True):
                replay()
                self.expert_output.copy_(self.model.routed_experts(index, self.routings[index]))
            self.replays[-1]()
        self.cache.advance(1)
        return self.logits

    def _segment(self, number: int) -> None:
        """From expert layer `number` - 1's routed experts (or the embedding) to expert layer `number`'s router
        (or the logits)."""
        if number == 0:
            x, expert_output, first = self.model.embed[self.token], None, 0
            self.context = self.model.attention_context(1, self.cache)
        else:
            first = self.expert_layers[number - 1] + 1
            x, expert_output = self.residuals[first - 1], self.expert_output  # added in the next norm
        is_last = number == len(self.expert_layers)
        end = len(self.model.layers) if is_last else self.expert_layers[number] + 1
        for index in range(first, end):
            x, routing = self.model.until_experts(index, x, self.context, self.cache, expert_output,
                                                  self.layer_outputs, self.capture)
            expert_output = None
            if routing is not None:
                self.residuals[index], self.routings[index] = x, routing
        if is_last:
            out = self.model.finish(x, expert_output, dict(self.layer_outputs), self.capture, last_only=False)
            self.logits, self.features = out if self.capture else (out, None)

    def _captured(self, segments: list[Callable[[], None]]) -> list[Callable[[], None]]:
        """The graphs share one memory pool: they always replay in capture order, and every tensor a later
        segment or the host reads stays referenced here, so a segment reuses only memory no longer needed."""
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
