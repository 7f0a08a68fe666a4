"""The one object in the UI process that talks to an engine: the local engine process or a remote server."""

import itertools
import queue
from dataclasses import replace

from PySide6.QtCore import QObject, QTimer, Signal

from app.protocol.engine_process import EngineProcess, spawn_engine
from app.protocol.events import Done, Error, Loaded, LoadProgress, ModelInfo, StepStats, Tokens
from app.protocol.requests import Generate, LoadModel
from app.remote import RemoteModel
from app.ui.engines import Engine, LocalEngine, RemoteEngine, check_in_background

FRAME_MS = 16
MAX_EVENTS_PER_FRAME = 2000


class EngineClient(QObject):
    """Chats through one `Engine` at a time, a `LocalEngine` once a model is loaded or a `RemoteEngine` once a
    remote server has answered, and pumps its events into signals once per frame (a remote sends no
    load_progress, step_stats or died).

    Signals (named as the events they report):
      load_progress(stage: str, fraction: float)
      loaded(info)                the model is ready: ModelInfo, or the RemoteModel chatted through
      tokens(events: list)        every `Tokens` event that arrived since the last frame, in order
      step_stats(stats: StepStats)
      finished(done: Done)
      error(error: Error)         the engine reported a failure; it is still running
      died(reason: str)           the engine process ended on its own; `restart()` starts a new one
      remote_failed(reason: str)  a remote server could not be used; what was loaded before stays
    """

    load_progress = Signal(str, float)
    loaded = Signal(object)
    tokens = Signal(list)
    step_stats = Signal(object)
    finished = Signal(object)
    error = Signal(object)
    died = Signal(str)
    remote_failed = Signal(str)

    def __init__(self, spawn=spawn_engine, parent: QObject | None = None):
        super().__init__(parent)
        self._spawn = spawn
        self.backend: Engine | None = None
        self.last_load: LoadModel | None = None
        self.info: ModelInfo | RemoteModel | None = None  # what is loaded
        self._remote_check: tuple[RemoteModel, queue.Queue] | None = None  # a server being asked, and its answer
        self._request_ids = itertools.count(1)
        self._timer = QTimer(self)
        self._timer.setInterval(FRAME_MS)
        self._timer.timeout.connect(self._pump)

    @property
    def engine(self) -> EngineProcess | None:
        """The local engine process; None when there is none (nothing loaded yet, or a remote instead)."""
        return self.backend.process if isinstance(self.backend, LocalEngine) else None

    @property
    def remote(self) -> RemoteModel | None:
        return self.backend.remote if isinstance(self.backend, RemoteEngine) else None

    @property
    def running(self) -> bool:
        return self.engine is not None

    def connect_remote(self, remote: RemoteModel) -> None:
        """Chat through `remote` once it has answered that it serves the model: then the local engine is
        shut down and `loaded` follows, with `remote` as its info. A server that cannot be used gives
        `remote_failed` and leaves what was loaded as it was."""
        self._remote_check = remote, check_in_background(remote)
        self._timer.start()

    def load(self, request: LoadModel) -> None:
        """Start the engine if needed and load `request` (exactly this plan)."""
        self._remote_check = None
        if not isinstance(self.backend, LocalEngine):
            self._start(None)
        self.last_load = request
        self.info = None
        self.backend.load(request)

    def generate(self, request: Generate) -> int:
        """Send `request` under a new request id, which is returned."""
        request = replace(request, request_id=next(self._request_ids))
        self.backend.generate(request)
        return request.request_id

    def cancel(self) -> None:
        if self.backend is not None:
            self.backend.cancel()

    def restart(self) -> None:
        """A new engine process, loading the last model again with the same plan."""
        self.shutdown()
        if self.last_load is not None:
            self.load(self.last_load)
        else:
            self._start(None)

    def shutdown(self) -> None:
        self._timer.stop()
        self._remote_check = None
        backend, self.backend, self.info = self.backend, None, None
        if backend is not None:
            backend.stop()

    def _start(self, remote: RemoteModel | None) -> None:
        """The engine chatted through from now on: a new engine process, or `remote`."""
        if self.backend is not None:
            self.backend.stop()
        self.backend = RemoteEngine(remote) if remote else LocalEngine(self._spawn)
        self._timer.start()

    def _take_remote_answer(self) -> None:
        remote, answer = self._remote_check
        try:
            result = answer.get_nowait()
        except queue.Empty:
            return
        self._remote_check = None
        if isinstance(result, Error):
            if self.backend is None:
                self._timer.stop()
            self.remote_failed.emit(result.message)
            return
        self._start(remote)
        self.last_load, self.info = None, remote
        self.loaded.emit(remote)

    def _pump(self) -> None:
        if self._remote_check is not None:
            self._take_remote_answer()
        backend = self.backend
        if backend is None:
            return
        batch: list[Tokens] = []
        drained = False
        for _ in range(MAX_EVENTS_PER_FRAME):
            event = backend.poll()
            if event is None:
                drained = True
                break
            if isinstance(event, Tokens):
                batch.append(event)
                continue
            if batch:
                self.tokens.emit(batch)
                batch = []
            self._dispatch(event)
            if self.backend is not backend:  # a slot restarted or shut the engine down
                return
        if batch:
            self.tokens.emit(batch)
        reason = backend.exit_reason() if drained else None
        if reason is not None and self.backend is backend:
            self._timer.stop()
            self.backend, self.info = None, None
            self.died.emit(reason)

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
