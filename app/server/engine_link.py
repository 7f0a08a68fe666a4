"""The HTTP server's end of the engine process: generations go out by id, and each one's events come
back to its own asyncio queue. A bounded number may be in flight; the engine decodes them together.

The link keeps an engine serving: when the process dies, or sends nothing (not even its heartbeat) for
`timeout_s`, every open generation gets an Error event (kind "unavailable"), the process is killed and a
new one loads the same plan. Meanwhile new generations are refused with EngineUnavailable; if the new
engine cannot load, the link stays stopped and says why.
"""

import asyncio
import itertools
import queue
import signal
import threading
import time
from collections import Counter, deque
from collections.abc import Callable
from dataclasses import replace

from app.errors import UserError
from app.protocol.engine_process import EngineProcess, spawn_engine
from app.protocol.events import Done, Error, Heartbeat, Loaded, LoadProgress, ModelInfo
from app.protocol.kinds import ErrorKind
from app.protocol.requests import Cancel, Generate, LoadModel

RECENT = 64  # ended generations kept for /v1/moechat/status
POLL_S = 0.25  # how often the event reader looks at the process while nothing arrives
READY, RESTARTING, STOPPED = "ready", "restarting", "stopped"


class Busy(Exception):
    """As many generations are in flight as the server takes: the client should retry later."""


class EngineUnavailable(Exception):
    """No engine is serving: it is being restarted (`retry`: try again shortly) or could not be."""

    def __init__(self, message: str, retry: bool):
        super().__init__(message)
        self.retry = retry


def exit_words(exitcode: int | None) -> str:
    if exitcode is not None and exitcode < 0:
        try:
            return f"killed by {signal.Signals(-exitcode).name}"
        except ValueError:
            return f"killed by signal {-exitcode}"
    return f"exit code {exitcode}"


def load(engine: EngineProcess, request: LoadModel, on_progress=lambda stage, fraction: None,
         timeout_s: float = 30.0) -> ModelInfo:
    """Load the model in the engine and wait for it; the Loaded info, or a UserError with the engine's words
    (also when the process ends, or sends nothing for `timeout_s`, while loading)."""
    engine.send(request)
    heard = time.monotonic()
    while True:
        try:
            event = engine.events.get(timeout=POLL_S)
        except queue.Empty:
            if not engine.process.is_alive():
                raise UserError(f"the engine stopped while loading ({exit_words(engine.process.exitcode)})") from None
            if time.monotonic() - heard > timeout_s:
                raise UserError(f"the engine sent nothing for {timeout_s:g} s while loading (stopped or hung)") \
                    from None
            continue
        heard = time.monotonic()
        if isinstance(event, LoadProgress):
            on_progress(event.stage, event.fraction)
        elif isinstance(event, Loaded):
            return event.info
        elif isinstance(event, Error):
            raise UserError(event.message)


def retire(engine: EngineProcess) -> None:
    """End an engine process that failed, at once, and let go of its queues."""
    engine.stop(timeout_s=0)
    for channel in (engine.requests, engine.events):
        channel.cancel_join_thread()  # nothing will read what is still buffered for it
        channel.close()


class EngineLink:
    """Owns the traffic with the engine process it keeps loaded. `open` and `close` run on the server's
    event loop; a thread reads the engine's events, hands each to the loop, and restarts a failed engine.

    A generation is in flight from `open` until its Done (or Error) comes back, also when its client has
    gone: then `close` has sent Cancel and the engine ends it before its next decode step.
    """

    def __init__(self, load_request: LoadModel, max_queue: int, timeout_s: float = 30.0,
                 spawn: Callable[[], EngineProcess] = spawn_engine):
        self.load_request, self.max_queue, self.timeout_s, self.spawn = load_request, max_queue, timeout_s, spawn
        self.engine: EngineProcess | None = None
        self.info: ModelInfo | None = None
        self.state = STOPPED
        self.restarts = 0
        self.failure: str | None = None  # why the last engine ended
        self.recent: deque[dict] = deque(maxlen=RECENT)
        self._heard = time.monotonic()
        self._stopping = False
        self._ids = itertools.count(1)
        self._in_flight: dict[int, asyncio.Queue | None] = {}  # None once its client has gone
        self._tokens: Counter = Counter()  # tokens the engine generated, per generation in flight
        self._cancel_reasons: dict[int, str] = {}
        self._loop: asyncio.AbstractEventLoop | None = None

    @property
    def max_in_flight(self) -> int:
        return (self.info.max_batch if self.info else 1) + self.max_queue

    def load_first(self, on_progress=lambda stage, fraction: None) -> ModelInfo:
        """Start the engine and load the plan, before the server answers; a UserError when it cannot."""
        self.engine, self.info = self._start(on_progress)
        self.state = READY
        return self.info

    def start(self) -> None:
        """Start reading events; call on the server's event loop."""
        self._loop = asyncio.get_running_loop()
        threading.Thread(target=self._keep_serving, name="engine-events", daemon=True).start()

    def stop(self) -> None:
        """End the engine process (the server is stopping)."""
        self._stopping = True
        if self.engine is not None:
            self.engine.stop()

    @property
    def in_flight(self) -> int:
        return len(self._in_flight)

    def open(self, request: Generate) -> tuple[int, asyncio.Queue]:
        """Send `request` under a new id; its events will arrive on the returned queue."""
        if self.state != READY:
            raise EngineUnavailable(self.unavailable_reason(), retry=self.state == RESTARTING)
        if len(self._in_flight) >= self.max_in_flight:
            raise Busy
        request_id = next(self._ids)
        events: asyncio.Queue = asyncio.Queue()
        self._in_flight[request_id] = events
        self.engine.send(replace(request, request_id=request_id))
        return request_id, events

    def unavailable_reason(self) -> str:
        if self.state == RESTARTING:
            return f"{self.failure}: the engine is being restarted, retry shortly"
        return f"{self.failure}: the engine could not be restarted; restart moechat serve"

    def cancel(self, request_id: int, reason: str) -> None:
        """Stop `request_id` if it is still running; its last events (Done included) still arrive."""
        if request_id in self._in_flight and request_id not in self._cancel_reasons:
            self._cancel_reasons[request_id] = reason
            self.engine.send(Cancel(request_id))

    def close(self, request_id: int, reason: str) -> None:
        """The client needs no more events of `request_id`; if it is still running, cancel it."""
        if request_id in self._in_flight:
            self._in_flight[request_id] = None
            self.cancel(request_id, reason)

    def status(self) -> dict:
        process = self.engine.process if self.engine else None
        return {
            "engine_pid": process.pid if process else None,
            "engine_alive": bool(process and process.is_alive()) and self.state == READY,
            "engine_state": self.state,
            "engine_heard_s_ago": round(time.monotonic() - self._heard, 3),
            "engine_restarts": self.restarts,
            "engine_failure": self.failure,
            "in_flight": self.in_flight,
            "max_in_flight": self.max_in_flight,
            "recent": list(self.recent),
        }

    def _start(self, on_progress=lambda stage, fraction: None) -> tuple[EngineProcess, ModelInfo]:
        engine = self.spawn()
        try:
            return engine, load(engine, self.load_request, on_progress, self.timeout_s)
        except BaseException:
            retire(engine)
            raise

    def _keep_serving(self) -> None:
        """The event reader's thread: relay the engine's events; when it fails, restart it."""
        engine = self.engine
        while True:
            failure = self._relay(engine)
            if failure is None or self._stopping:
                return
            self._loop.call_soon_threadsafe(self._failed, failure)
            retire(engine)
            try:
                engine, info = self._start()
            except UserError as error:
                self._loop.call_soon_threadsafe(self._gave_up, f"{failure}; its restart failed: {error}")
                return
            if self._stopping:
                retire(engine)
                return
            self._loop.call_soon_threadsafe(self._restarted, engine, info)

    def _relay(self, engine: EngineProcess) -> str | None:
        """Hand the engine's events to the loop until it fails (then why, in words) or the server stops."""
        self._heard = time.monotonic()
        while not self._stopping:
            try:
                event = engine.events.get(timeout=POLL_S)
            except queue.Empty:
                if not engine.process.is_alive():
                    return f"the engine process ended ({exit_words(engine.process.exitcode)})"
                if time.monotonic() - self._heard > self.timeout_s:
                    return f"the engine sent nothing for {self.timeout_s:g} s (stopped or hung)"
                continue
            except (OSError, EOFError, ValueError):
                return f"the engine's event queue broke ({exit_words(engine.process.exitcode)})"
            self._heard = time.monotonic()
            if not isinstance(event, Heartbeat):
                self._loop.call_soon_threadsafe(self._deliver, event)
        return None

    def _deliver(self, event) -> None:
        request_id = getattr(event, "request_id", None)
        if request_id not in self._in_flight:
            return
        self._tokens[request_id] += len(getattr(event, "token_ids", ()))
        events = self._in_flight[request_id]
        if events is not None:
            events.put_nowait(event)
        if isinstance(event, Done | Error):
            self._ended(request_id, event.stop_reason if isinstance(event, Done) else event.kind)

    def _ended(self, request_id: int, how: str) -> None:
        del self._in_flight[request_id]
        self.recent.append({
            "id": request_id,
            "stop_reason": how,
            "generated_tokens": self._tokens.pop(request_id, 0),
            "cancelled_because": self._cancel_reasons.pop(request_id, None),
            "ended_at": time.time(),
        })

    def _failed(self, failure: str) -> None:
        self.state, self.failure = RESTARTING, failure
        self.restarts += 1
        for request_id, events in list(self._in_flight.items()):
            if events is not None:
                events.put_nowait(Error(ErrorKind.UNAVAILABLE, f"{failure}: the server is restarting it; send the "
                                        "request again", request_id))
            self._ended(request_id, ErrorKind.UNAVAILABLE)

    def _restarted(self, engine: EngineProcess, info: ModelInfo) -> None:
        self.engine, self.info, self.state = engine, info, READY

    def _gave_up(self, failure: str) -> None:
        self.state, self.failure = STOPPED, failure
