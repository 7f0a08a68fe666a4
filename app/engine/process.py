"""The engine process: a loop that takes requests from one queue and puts events on another.

`EngineServer` does the work and reports through `send`; the loop around it only moves messages,
so tests can drive the server directly. The process is started by `protocol.spawn_engine`.
"""

import queue
import time
from collections import Counter, deque
from collections.abc import Callable
from dataclasses import replace

import torch

from app.engine.protocol import (
    Cancel,
    Done,
    Error,
    Generate,
    Loaded,
    LoadModel,
    LoadProgress,
    Shutdown,
    StepStats,
)
from app.engine.sampling import SamplingParams
from app.engine.session import Prompt, Session
from app.engine.spec.options import SpecOptions
from app.errors import UserError

STATS_INTERVAL_S = 0.1


class Cancelled(Exception):
    pass


class EngineServer:
    """Serves one request at a time; `cancel_requested()` is polled between steps."""

    def __init__(self, send: Callable[[object], None], cancel_requested: Callable[[], bool]):
        self.send = send
        self.cancel_requested = cancel_requested
        self.session: Session | None = None

    def handle(self, request) -> None:
        try:
            if isinstance(request, LoadModel):
                self._load(request)
            elif isinstance(request, Generate):
                self._generate(request)
        except Cancelled:
            self.send(Error("cancelled", "cancelled", getattr(request, "request_id", None)))
        except UserError as error:
            kind = "load" if isinstance(request, LoadModel) else "request"
            self.send(Error(kind, str(error), getattr(request, "request_id", None)))
        except torch.OutOfMemoryError:
            self.send(Error("oom", "out of GPU memory: lower the GPU budget or the context and load again",
                            getattr(request, "request_id", None)))

    def _load(self, request: LoadModel) -> None:
        self.session = None

        def progress(stage: str, fraction: float) -> None:
            if self.cancel_requested():
                raise Cancelled
            self.send(LoadProgress(stage, fraction))

        spec = SpecOptions(request.spec, request.drafter, request.block_size)
        self.session = Session.load(
            request.path, spec, device=request.device, dtype=request.dtype, gpu_budget=request.gpu_budget,
            ram_budget=request.ram_budget, context=request.context, on_progress=progress,
        )
        loaded = self.session.loaded
        self.send(Loaded({
            "path": request.path,
            "model_type": loaded.folder.model_type,
            "vocab_size": loaded.facts.vocab_size,
            "context": loaded.context,
            "expert_slots": loaded.placement.expert_slots,
            "total_experts": loaded.facts.total_experts,
            "device_bytes": loaded.placement.device_bytes,
            "has_tokenizer": self.session.tokenizer is not None,
            "spec": spec.method,
        }))

    def _generate(self, request: Generate) -> None:
        if self.session is None:
            raise UserError("no model is loaded: load one first")
        prompt = Prompt(request.token_ids, request.text, request.messages, request.reasoning_effort)
        ids = self.session.prompt_ids(prompt)
        sampling = SamplingParams(request.temperature, request.top_k, request.top_p, request.seed)
        experts = self.session.loaded.model.experts
        last_stats, last_time, tokens_since = experts.snapshot(), time.perf_counter(), 0
        events = self.session.generate(ids, sampling, request.max_new_tokens)
        for event in events:
            if isinstance(event, Done):
                self.send(Done(event.stop_reason, event.stats, request.request_id))
                return
            self.send(replace(event, request_id=request.request_id))
            tokens_since += len(event.token_ids)
            now = time.perf_counter()
            if now - last_time >= STATS_INTERVAL_S:
                current = experts.snapshot()
                self.send(_step_stats(request.request_id, tokens_since, now - last_time, current.since(last_stats),
                                      residency(experts)))
                last_stats, last_time, tokens_since = current, now, 0
            if self.cancel_requested():
                events.close()
                self.send(Done("cancelled", {}, request.request_id))
                return


def _step_stats(request_id: int, tokens: int, seconds: float, delta, resident: list[float]) -> StepStats:
    figures = delta.as_dict()
    return StepStats(request_id, tokens, seconds, delta.hits, delta.misses, delta.bytes_fetched,
                     figures["prefetch_coverage"], figures["prefetch_waste"], resident)


def residency(cache) -> list[float]:
    """For each MoE layer of the `ExpertCache`, in layer order, the fraction of its experts in device slots."""
    per_layer = Counter(layer for layer, _ in cache.resident())
    return [per_layer[layer] / cache.store.num_experts for layer in cache.store.layers]


def engine_main(requests, events) -> None:
    """The child process's loop. A Cancel or Shutdown that arrives mid-request stops that request."""
    waiting: deque = deque()

    def cancel_requested() -> bool:
        while True:
            try:
                request = requests.get_nowait()
            except queue.Empty:
                return False
            if isinstance(request, Cancel):
                return True
            waiting.append(request)
            if isinstance(request, Shutdown):
                return True

    server = EngineServer(events.put, cancel_requested)
    while True:
        request = waiting.popleft() if waiting else requests.get()
        if isinstance(request, Shutdown):
            return
        if not isinstance(request, Cancel):
            server.handle(request)
