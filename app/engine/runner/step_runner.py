"""The one owner of a model's passes over a KV cache. A pass runs as one CUDA graph where experts need no host
work (cuda_graph.py), as graphs around the host's expert work for single tokens (segmented_decode.py), else
eagerly. Programs are captured on first use and kept for later sequences over the same cache.
"""

from collections.abc import Callable, Iterable

import torch

from app.engine.layers.kv_cache import KVCache
from app.engine.runner.cuda_graph import DecodeGraph, graph_ready
from app.engine.runner.segmented_decode import SegmentedDecode, segments_ready
from app.plan import PREFILL_CHUNK


def prefill(
    model, cache: KVCache, prompt_ids: list[int], capture: tuple[int, ...] = (),
    on_features: Callable[[list[int], torch.Tensor], None] | None = None,
) -> torch.Tensor:
    """-> logits of the last position [V]; with `capture`, each chunk's ids and features [chunk, F] go to
    `on_features`."""
    ids = torch.tensor(prompt_ids, device=model.device)
    for start in range(0, len(ids), PREFILL_CHUNK):
        chunk = ids[start : start + PREFILL_CHUNK]
        if capture:
            logits, features = model.forward(chunk, cache, last_only=True, capture=capture)
            on_features(prompt_ids[start : start + PREFILL_CHUNK], features)
        else:
            logits = model.forward(chunk, cache, last_only=True)
    return logits[-1]


class EagerPass:
    """The model's forward behind the captured passes' interface."""

    def __init__(self, model, cache: KVCache, capture: tuple[int, ...]):
        self.model, self.cache, self.capture = model, cache, capture
        self.features: torch.Tensor | None = None

    def run(self, tokens: list[int]) -> torch.Tensor:
        return self.run_on_device(torch.tensor(tokens, device=self.model.device))

    def run_on_device(self, tokens: torch.Tensor) -> torch.Tensor:
        out = self.model.forward(tokens, self.cache, capture=self.capture)
        logits, self.features = out if self.capture else (out, None)
        return logits


class StepRunner:
    """Passes over one KV cache of `capacity` tokens; outputs are overwritten by the next pass of the same size.
    `run_ahead` False keeps every decode step waiting for its token (the comparison for the passes run ahead)."""

    def __init__(self, model, capacity: int, run_ahead: bool = True):
        self.model = model
        self.run_ahead = run_ahead
        self.cache = model.new_kv_cache(capacity)
        # (tokens, captured layers) -> the pass's program, captured at its first use
        self.programs: dict[tuple[int, tuple[int, ...]], DecodeGraph | SegmentedDecode | EagerPass] = {}
        self._pool = None  # the graphs' memory pool: they replay one at a time

    def begin(self) -> KVCache:
        self.cache.truncate(0)
        return self.cache

    def prepare(self, sizes: Iterable[int], capture: tuple[int, ...] = ()) -> None:
        """Capture these pass sizes before a prefill, so no step waits for them."""
        for size in sizes:
            self.program(size, capture)

    def prefill(self, prompt_ids: list[int], capture: tuple[int, ...] = (),
                on_features: Callable[[list[int], torch.Tensor], None] | None = None) -> torch.Tensor:
        logits = prefill(self.model, self.cache, prompt_ids, capture, on_features)
        self.model.experts.settle()
        return logits

    def run(self, tokens: list[int], capture: tuple[int, ...] = ()) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Commits `tokens`: -> logits [T, V], features [T, F] or None."""
        program = self.program(len(tokens), capture)
        logits = program.run(tokens)
        self.model.experts.settle()
        return logits, program.features

    @property
    def runs_ahead(self) -> bool:
        """Whether a pass may start before the host reads its input token (`run_on_device`): the expert cache
        counts its work on the device alone, and the pass needs no host work."""
        return self.run_ahead and self.model.experts.complete

    def run_on_device(self, tokens: torch.Tensor, capture: tuple[int, ...] = ()
                      ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Commits `tokens` [T] (long, on the device, maybe not yet computed): -> logits [T, V], features [T, F]
        or None."""
        assert self.runs_ahead
        program = self.program(len(tokens), capture)
        logits = program.run_on_device(tokens)
        self.model.experts.settle()
        return logits, program.features

    def program(self, num_tokens: int, capture: tuple[int, ...] = ()) -> DecodeGraph | SegmentedDecode | EagerPass:
        key = (num_tokens, capture)
        if key not in self.programs:
            self.programs[key] = self._new_program(num_tokens, capture)
        return self.programs[key]

    def _new_program(self, num_tokens: int, capture: tuple[int, ...]) -> DecodeGraph | SegmentedDecode | EagerPass:
        if graph_ready(self.model):
            if self._pool is None:
                self._pool = torch.cuda.graph_pool_handle()
            return DecodeGraph(self.model, self.cache, capture, num_tokens, self._pool)
        if num_tokens == 1 and segments_ready(self.model):
            return SegmentedDecode(self.model, self.cache, capture)
        return EagerPass(self.model, self.cache, capture)


class RunnerPool:
    """A sequence takes an idle runner large enough (its captured passes with it) or a new one of its size. All
    caches together never exceed `tokens` (the planned KV cache): idle ones are dropped, largest first, for room.
    With `sole` every sequence runs over one runner of all `tokens`, one at a time."""

    def __init__(self, model, tokens: int, sole: StepRunner | None = None):
        self.model, self.tokens, self.sole = model, tokens, sole
        self.idle: list[StepRunner] = []
        self.held: list[StepRunner] = []

    def fits(self, capacity: int) -> bool:
        if self.sole is not None:
            return not self.held
        return self._held_tokens() + capacity <= self.tokens

    def take(self, capacity: int) -> StepRunner:
        assert self.fits(capacity), "no room: ask fits first"
        held = self._held_tokens()
        reusable = [r for r in self.idle if capacity <= r.cache.capacity and held + r.cache.capacity <= self.tokens]
        if self.sole is not None:
            runner = self.sole
        elif reusable:
            runner = min(reusable, key=lambda r: r.cache.capacity)
            self.idle.remove(runner)
        else:
            self.idle.sort(key=lambda r: r.cache.capacity)
            while self.idle and held + capacity + sum(r.cache.capacity for r in self.idle) > self.tokens:
                self.idle.pop()
            runner = StepRunner(self.model, capacity)
        self.held.append(runner)
        return runner

    def _held_tokens(self) -> int:
        return sum(runner.cache.capacity for runner in self.held)

    def give_back(self, runner: StepRunner) -> None:
        self.held.remove(runner)
        if runner is not self.sole:
            self.idle.append(runner)
