"""The engine process: `EngineServer` does the work and reports through `send`; the loop around it only moves
messages, so tests drive the server directly. No request can end the engine: whatever one raises becomes an Error
event for it (for a batch step, for the requests in that step).
"""

import queue
import time
from collections import Counter, deque
from collections.abc import Callable
from dataclasses import dataclass

import torch

from app.engine.generation.batch import Batch
from app.engine.generation.sampling import SamplingParams
from app.engine.session import Prompt, Session
from app.engine.spec.options import SpecOptions
from app.engine.text.prompts import PromptWorker
from app.errors import UserError
from app.protocol.events import Done, Error, Loaded, LoadProgress, ModelInfo, StepStats, Tokens
from app.protocol.kinds import ErrorKind, StopReason
from app.protocol.requests import Cancel, Generate, LoadModel, Shutdown
from app.request_limits import check_seed, check_temperature, check_top_k, check_top_p

STATS_INTERVAL_S = 0.1
OUT_OF_MEMORY = "out of GPU memory: lower the GPU budget or the context and load again"


class Cancelled(Exception):
    pass


@dataclass(frozen=True, slots=True)
class PromptReady:
    """Put on the engine's own request queue when a prompt's ids are ready, to wake its loop."""


def failure(error: Exception, request_id: int | None, kind: ErrorKind = ErrorKind.INTERNAL) -> Error:
    if isinstance(error, torch.OutOfMemoryError):
        return Error(ErrorKind.OOM, OUT_OF_MEMORY, request_id)
    words = (str(error).splitlines() or [""])[0]
    return Error(kind, f"the engine failed on this request ({type(error).__name__}: {words}); it goes on "
                       "serving the others", request_id)


class EngineServer:
    """Generations, plain or speculative, decode together in a `Batch`: `handle(Generate)` prefills, `step()`
    moves each on one step. `cancel_requested()` is polled during loads and after each step; True stops all."""

    def __init__(self, send: Callable[[object], None], cancel_requested: Callable[[], bool],
                 wake: Callable[[], None] = lambda: None):
        self.send = send
        self.cancel_requested = cancel_requested
        self.session: Session | None = None
        self.batch: Batch | None = None
        self.prompts = PromptWorker(wake)
        self._stats: StatsClock | None = None

    @property
    def busy(self) -> bool:
        return self.batch is not None and bool(self.batch.sequences)

    def prepare(self, request: Generate) -> None:
        """Start making `request`'s prompt ids on the prompt thread, for the model loaded now."""
        session = self.session
        self.prompts.submit(request.request_id, lambda: _prompt_ids(session, request))

    def prepared(self, request: Generate) -> bool:
        """Its prompt ids are made (or failed), or it was never prepared (then `handle` makes them)."""
        return not self.prompts.submitted(request.request_id) or self.prompts.result(request.request_id) is not None

    def can_start(self, request: Generate) -> bool:
        """A request the engine will refuse can always start, to be refused."""
        if self.batch is None:
            return True
        ids = self.prompts.result(request.request_id)
        if not isinstance(ids, list):
            return True
        return self.batch.has_room(self.batch.cache_tokens(len(ids), request.max_new_tokens))

    def handle(self, request) -> None:
        request_id = getattr(request, "request_id", None)
        loading = isinstance(request, LoadModel)
        try:
            if loading:
                self._load(request)
            elif isinstance(request, Generate):
                self._generate(request)
        except Cancelled:
            self.send(Error(ErrorKind.CANCELLED, "cancelled", request_id))
        except UserError as error:
            self.send(Error(ErrorKind.LOAD if loading else ErrorKind.REQUEST, str(error), request_id))
        except Exception as error:
            self.send(failure(error, request_id, ErrorKind.LOAD if loading else ErrorKind.INTERNAL))

    def step(self) -> None:
        try:
            events = self.batch.step()
        except Exception as error:  # it cannot be told whose it was: every generation of the step ends
            for request_id in list(self.batch.sequences):
                self.batch.leave(request_id)
                self.send(failure(error, request_id))
            return
        self._send_all(events)
        if self.cancel_requested():
            self.cancel(None)

    def cancel(self, request_id: int | None) -> None:
        """`request_id` None: all. Its Done carries the figures of what it did."""
        if self.batch is None:
            return
        for running in [request_id] if request_id is not None else list(self.batch.sequences):
            stats = self.batch.leave(running)
            if stats is not None:
                self.send(Done(StopReason.CANCELLED, stats, running))

    def _load(self, request: LoadModel) -> None:
        self.cancel(None)
        self.session, self.batch = None, None

        def progress(stage: str, fraction: float) -> None:
            if self.cancel_requested():
                raise Cancelled
            self.send(LoadProgress(stage, fraction))

        spec = SpecOptions(request.spec, request.drafter, request.block_size)
        self.session = Session.load(
            request.path, spec, device=request.device, dtype=request.dtype, gpu_budget=request.gpu_budget,
            ram_budget=request.ram_budget, context=request.context, on_progress=progress,
            cpu_threads=request.cpu_threads,
        )
        loaded = self.session.loaded
        self.batch = Batch(self.session, request.max_batch)
        self._stats = StatsClock(loaded.model.experts)
        self.send(Loaded(ModelInfo(
            request.path, loaded.folder.model_type, loaded.facts.vocab_size, loaded.context,
            loaded.placement.expert_slots, loaded.facts.total_experts, loaded.placement.device_bytes,
            has_tokenizer=self.session.tokenizer is not None, spec=spec.method,
            max_batch=request.max_batch,
        )))

    def _generate(self, request: Generate) -> None:
        made = self.prompts.result(request.request_id)
        self.prompts.forget(request.request_id)
        if made is None:
            made = _prompt_ids(self.session, request)
        if isinstance(made, Exception):
            raise made
        ids = made
        sampling = SamplingParams(check_temperature(request.temperature), check_top_k(request.top_k),
                                  check_top_p(request.top_p), check_seed(request.seed))
        if not self.busy:
            self._stats.restart()
        self._send_all(self.batch.join(request.request_id, ids, sampling, request.max_new_tokens))

    def _send_all(self, events: list) -> None:
        """The figures since the last ones go before any Done (a request's last event)."""
        ends = [event for event in events if isinstance(event, Done)]
        for event in events:
            if not isinstance(event, Done):
                self.send(event)
        ended = [event.request_id for event in ends]
        for event in self._stats.tick(events, list(self.batch.sequences), ended) + ends:
            self.send(event)


class StatsClock:
    """StepStats at most every STATS_INTERVAL_S; the expert cache's work is shared by a batch's generations."""

    def __init__(self, experts):
        self.experts = experts
        self.restart()

    def restart(self) -> None:
        self.last_stats, self.last_time = self.experts.snapshot(), time.perf_counter()
        self.tokens = Counter()

    def tick(self, events: list, running: list[int], ended: list[int]) -> list[StepStats]:
        """Also at once for the generations that `ended` in `events`: a short answer still gets its figures."""
        for event in events:
            if isinstance(event, Tokens):
                self.tokens[event.request_id] += len(event.token_ids)
        now = time.perf_counter()
        if now - self.last_time < STATS_INTERVAL_S and not ended:
            return []
        running = running + ended
        current = self.experts.snapshot()
        delta, seconds, resident = current.since(self.last_stats), now - self.last_time, residency(self.experts)
        reported = [_step_stats(request_id, self.tokens[request_id], seconds, delta, resident)
                    for request_id in running]
        self.last_stats, self.last_time, self.tokens = current, now, Counter()
        return reported


def _step_stats(request_id: int, tokens: int, seconds: float, delta, resident: list[float]) -> StepStats:
    return StepStats(request_id, tokens, seconds, delta.hits, delta.misses, delta.bytes_fetched,
                     delta.prefetch_coverage, delta.prefetch_waste, resident, delta.cpu_computed)


def residency(cache) -> list[float]:
    """Per MoE layer, in order, the fraction of its experts in device slots."""
    per_layer = Counter(layer for layer, _ in cache.resident())
    return [per_layer[layer] / cache.store.num_experts for layer in cache.store.layers]


def engine_main(requests, events) -> None:
    """Requests in arrival order: a Generate once its prompt ids are made and the batch has room, a LoadModel once
    no generation runs, Shutdown at once. Arrivals are read between steps, so a Cancel acts before the next."""
    inbox: deque = deque()

    def cancel_requested() -> bool:
        """File the requests that arrived; True when one stops everything running (Cancel(), Shutdown)."""
        stop_all = False
        while True:
            try:
                request = requests.get_nowait()
            except queue.Empty:
                return stop_all
            stop_all |= file(request)

    def file(request) -> bool:
        if isinstance(request, PromptReady):
            return False
        if not isinstance(request, Cancel):
            inbox.append(request)
            return isinstance(request, Shutdown)
        waiting = [r for r in inbox if isinstance(r, Generate) and request.request_id in (None, r.request_id)]
        for generate in waiting:
            inbox.remove(generate)
            server.prompts.forget(generate.request_id)
            events.put(Done(StopReason.CANCELLED, None, generate.request_id))
        if request.request_id is None:
            return True
        server.cancel(request.request_id)
        return False

    def prepare_prompts() -> None:
        """Only the Generates ahead of any LoadModel (those behind one are for the model it loads)."""
        for request in inbox:
            if isinstance(request, LoadModel):
                return
            if isinstance(request, Generate) and not server.prompts.submitted(request.request_id):
                server.prepare(request)

    server = EngineServer(events.put, cancel_requested, wake=lambda: requests.put(PromptReady()))
    while True:
        if not inbox and not server.busy:
            file(requests.get())
        if cancel_requested():
            server.cancel(None)
        prepare_prompts()
        while inbox:
            head = inbox[0]
            if isinstance(head, Shutdown):
                return
            if isinstance(head, Generate) and not server.prepared(head):
                break
            if server.busy and (isinstance(head, LoadModel) or not server.can_start(head)):
                break
            server.handle(inbox.popleft())
            prepare_prompts()
        if server.busy:
            server.step()
        elif inbox:  # idle, the first request waits for its prompt ids: sleep until they (or a request) come
            file(requests.get())


def _prompt_ids(session: Session | None, request: Generate) -> list[int]:
    if session is None:
        raise UserError("no model is loaded: load one first")
    return session.prompt_ids(Prompt(request.token_ids, request.text, request.messages, request.reasoning_effort))
