"""The one object in the UI process that talks to the engine process."""

import itertools
import queue
import signal
from dataclasses import replace

from PySide6.QtCore import QObject, QTimer, Signal

from app.engine.protocol import (
    Cancel,
    Done,
    EngineProcess,
    Error,
    Generate,
    Loaded,
    LoadModel,
    LoadProgress,
    StepStats,
    Tokens,
    spawn_engine,
)

FRAME_MS = 16
MAX_EVENTS_PER_FRAME = 2000


def exit_reason(exitcode: int) -> str:
    """An engine process's end in words."""
    if exitcode == -signal.SIGKILL:
        return "the engine was killed (out of memory?)"
    if exitcode == -signal.SIGSEGV:
        return "the engine crashed (segmentation fault)"
    if exitcode == -signal.SIGABRT:
        return "the engine aborted (a CUDA or library error)"
    if exitcode == -signal.SIGTERM:
        return "the engine was terminated"
    if exitcode < 0:
        try:
            return f"the engine was stopped by {signal.Signals(-exitcode).name}"
        except ValueError:
            return f"the engine was stopped by signal {-exitcode}"
    if exitcode == 0:
        return "the engine exited unexpectedly"
    return f"the engine exited with code {exitcode}"


class EngineClient(QObject):
    """Owns the engine process; pumps its events into signals once per frame.

    Signals (named as the events they report):
      load_progress(stage: str, fraction: float)
      loaded(info: dict)          the model is ready (LoadModel's figures and the placement)
      tokens(events: list)        every `Tokens` event that arrived since the last frame, in order
      step_stats(stats: StepStats)
      finished(done: Done)
      error(error: Error)         the engine reported a failure; it is still running
      died(reason: str)           the engine process ended on its own; `restart()` starts a new one
    """

    load_progress = Signal(str, float)
    loaded = Signal(dict)
    tokens = Signal(list)
    step_stats = Signal(object)
    finished = Signal(object)
    error = Signal(object)
    died = Signal(str)

    def __init__(self, spawn=spawn_engine, parent: QObject | None = None):
        super().__init__(parent)
        self._spawn = spawn
        self.engine: EngineProcess | None = None
        self.last_load: LoadModel | None = None
        self.info: dict | None = None  # what the engine has loaded
        self._request_ids = itertools.count(1)
        self._timer = QTimer(self)
        self._timer.setInterval(FRAME_MS)
        self._timer.timeout.connect(self._pump)

    @property
    def running(self) -> bool:
        return self.engine is not None

    def load(self, request: LoadModel) -> None:
        """Start the engine if needed and load `request` (exactly this plan)."""
        self._ensure_started()
        self.last_load = request
        self.info = None
        self.engine.send(request)

    def generate(self, request: Generate) -> int:
        """Send `request` under a new request id, which is returned."""
        request = replace(request, request_id=next(self._request_ids))
        self.engine.send(request)
        return request.request_id

    def cancel(self) -> None:
        if self.engine is not None:
            self.engine.send(Cancel())

    def restart(self) -> None:
        """A new engine process, loading the last model again with the same plan."""
        self.shutdown()
        if self.last_load is not None:
            self.load(self.last_load)
        else:
            self._ensure_started()

    def shutdown(self) -> None:
        self._timer.stop()
        engine, self.engine, self.info = self.engine, None, None
        if engine is not None:
            engine.stop(timeout_s=2.0)

    def _ensure_started(self) -> None:
        if self.engine is None:
            self.engine = self._spawn()
            self._timer.start()

    def _pump(self) -> None:
        engine = self.engine
        batch: list[Tokens] = []
        drained = False
        for _ in range(MAX_EVENTS_PER_FRAME):
            try:
                event = engine.events.get_nowait()
            except (queue.Empty, OSError, EOFError):
                drained = True
                break
            if isinstance(event, Tokens):
                batch.append(event)
                continue
            if batch:
                self.tokens.emit(batch)
                batch = []
            self._dispatch(event)
            if self.engine is not engine:  # a slot restarted or shut the engine down
                return
        if batch:
            self.tokens.emit(batch)
        exitcode = engine.process.exitcode
        if drained and exitcode is not None and self.engine is engine:
            self._timer.stop()
            self.engine, self.info = None, None
            self.died.emit(exit_reason(exitcode))

    def _dispatch(self, event) -> None:
        if isinstance(event, LoadProgress):
            self.load_progress.emit(event.stage, event.fraction)
        elif isinstance(event, Loaded):
            self.info = event.info
            self.loaded.emit(event.info)
        elif isinstance(event, StepStats):
            self.step_stats.emit(event)
        elif isinstance(event, Done):
            self.finished.emit(event)
        elif isinstance(event, Error):
            self.error.emit(event)
