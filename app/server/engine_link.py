"""The HTTP server's end of the engine process: generations go out by id, and each one's events come
back to its own asyncio queue. A bounded number may be in flight; the engine decodes them together."""

import asyncio
import itertools
import queue
import threading
import time
from collections import Counter, deque
from dataclasses import replace

from app.engine.protocol import Cancel, Done, EngineProcess, Error, Generate, Loaded, LoadModel, LoadProgress
from app.errors import UserError

RECENT = 64  # ended generations kept for /v1/moechat/status


class Busy(Exception):
    """As many generations are in flight as the server takes: the client should retry later."""


def load(engine: EngineProcess, request: LoadModel, on_progress=lambda stage, fraction: None) -> dict:
    """Load the model in the engine and wait for it; the Loaded info, or a UserError with the engine's words."""
    engine.send(request)
    while True:
        try:
            event = engine.events.get(timeout=1.0)
        except queue.Empty:
            if not engine.process.is_alive():
                raise UserError(f"the engine stopped while loading (exit code {engine.process.exitcode})") from None
            continue
        if isinstance(event, LoadProgress):
            on_progress(event.stage, event.fraction)
        elif isinstance(event, Loaded):
            return event.info
        elif isinstance(event, Error):
            raise UserError(event.message)


class EngineLink:
    """Owns the traffic with one loaded engine process. `open` and `close` run on the server's event loop;
    a thread reads the engine's events and hands each to the loop.

    A generation is in flight from `open` until its Done (or Error) comes back, also when its client has
    gone: then `close` has sent Cancel and the engine ends it before its next decode step.
    """

    def __init__(self, engine: EngineProcess, max_in_flight: int):
        self.engine = engine
        self.max_in_flight = max_in_flight
        self.stopped: str | None = None  # why the engine is gone, once it is
        self.recent: deque[dict] = deque(maxlen=RECENT)
        self._ids = itertools.count(1)
        self._in_flight: dict[int, asyncio.Queue | None] = {}  # None once its client has gone
        self._tokens: Counter = Counter()  # tokens the engine generated, per generation in flight
        self._cancel_reasons: dict[int, str] = {}
        self._loop: asyncio.AbstractEventLoop | None = None

    def start(self) -> None:
        """Start reading events; call on the server's event loop."""
        self._loop = asyncio.get_running_loop()
        threading.Thread(target=self._read_events, name="engine-events", daemon=True).start()

    @property
    def in_flight(self) -> int:
        return len(self._in_flight)

    def open(self, request: Generate) -> tuple[int, asyncio.Queue]:
        """Send `request` under a new id; its events will arrive on the returned queue."""
        if self.stopped:
            raise UserError(f"the engine has stopped ({self.stopped}): restart moechat serve")
        if len(self._in_flight) >= self.max_in_flight:
            raise Busy
        request_id = next(self._ids)
        events: asyncio.Queue = asyncio.Queue()
        self._in_flight[request_id] = events
        self.engine.send(replace(request, request_id=request_id))
        return request_id, events

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
        return {
            "engine_pid": self.engine.process.pid,
            "engine_alive": self.engine.process.is_alive(),
            "in_flight": self.in_flight,
            "max_in_flight": self.max_in_flight,
            "recent": list(self.recent),
        }

    def _read_events(self) -> None:
        while True:
            try:
                event = self.engine.events.get(timeout=0.5)
            except queue.Empty:
                if not self.engine.process.is_alive():
                    self._loop.call_soon_threadsafe(self._engine_stopped, self.engine.process.exitcode)
                    return
                continue
            except (OSError, EOFError):
                self._loop.call_soon_threadsafe(self._engine_stopped, self.engine.process.exitcode)
                return
            self._loop.call_soon_threadsafe(self._deliver, event)

    def _deliver(self, event) -> None:
        request_id = getattr(event, "request_id", None)
        if request_id not in self._in_flight:
            return
        self._tokens[request_id] += len(getattr(event, "token_ids", ()))
        events = self._in_flight[request_id]
        if events is not None:
            events.put_nowait(event)
        if isinstance(event, Done | Error):
            del self._in_flight[request_id]
            self.recent.append({
                "id": request_id,
                "stop_reason": event.stop_reason if isinstance(event, Done) else event.kind,
                "generated_tokens": self._tokens.pop(request_id),
                "cancelled_because": self._cancel_reasons.pop(request_id, None),
                "ended_at": time.time(),
            })

    def _engine_stopped(self, exitcode: int | None) -> None:
        self.stopped = f"exit code {exitcode}"
        for request_id, events in list(self._in_flight.items()):
            if events is not None:
                events.put_nowait(Error("internal", f"the engine stopped (exit code {exitcode})", request_id))
        self._in_flight.clear()
