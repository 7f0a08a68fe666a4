"""The one object in the UI process that talks to the engine process, or to a remote server."""

import itertools
import queue
import signal
import threading
import weakref
from dataclasses import replace

from PySide6.QtCore import QObject, QTimer, Signal

from app.errors import UserError, first_line
from app.protocol.engine_process import EngineProcess, spawn_engine
from app.protocol.events import Done, Error, Loaded, LoadProgress, ModelInfo, StepStats, Tokens
from app.protocol.kinds import ErrorKind
from app.protocol.requests import Cancel, Generate, LoadModel
from app.remote import RemoteModel, check_remote, stream_chat

FRAME_MS = 16
STOP_S = 2.0  # how long the engine may take to obey Shutdown before it is killed
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
    """Owns the engine process; pumps its events into signals once per frame. Connected to a remote
    server instead (`connect_remote`), it has no engine process: generations go over HTTP from worker
    threads, whose events arrive through the same signals (no load_progress, step_stats or died).

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
        self.engine: EngineProcess | None = None
        self.last_load: LoadModel | None = None
        self.info: ModelInfo | RemoteModel | None = None  # what is loaded
        self.remote: RemoteModel | None = None
        self._remote_events: queue.Queue = queue.Queue()
        self._remote_check: tuple[RemoteModel, queue.Queue] | None = None  # a server being asked, and its answer
        self._remote_cancels: dict[int, threading.Event] = {}
        self._request_ids = itertools.count(1)
        self._timer = QTimer(self)
        self._timer.setInterval(FRAME_MS)
        self._timer.timeout.connect(self._pump)

    @property
    def running(self) -> bool:
        return self.engine is not None

    def connect_remote(self, remote: RemoteModel) -> None:
        """Chat through `remote` once it has answered that it serves the model: then the local engine is
        shut down and `loaded` follows, with `remote` as its info. A server that cannot be used gives
        `remote_failed` and leaves what was loaded as it was."""
        answer: queue.Queue = queue.Queue()
        self._remote_check = remote, answer
        threading.Thread(target=self._check_remote, args=(remote, answer), daemon=True).start()
        self._timer.start()

    def load(self, request: LoadModel) -> None:
        """Start the engine if needed and load `request` (exactly this plan)."""
        self.remote, self._remote_check = None, None
        self._ensure_started()
        self.last_load = request
        self.info = None
        self.engine.send(request)

    def generate(self, request: Generate) -> int:
        """Send `request` under a new request id, which is returned."""
        request = replace(request, request_id=next(self._request_ids))
        if self.remote is not None:
            cancelled = self._remote_cancels[request.request_id] = threading.Event()
            threading.Thread(target=stream_chat, args=(self.remote, request, self._remote_events.put,
                                                       cancelled.is_set), daemon=True).start()
        else:
            self.engine.send(request)
        return request.request_id

    def cancel(self) -> None:
        if self.engine is not None:
            self.engine.send(Cancel())
        for cancelled in self._remote_cancels.values():
            cancelled.set()

    def restart(self) -> None:
        """A new engine process, loading the last model again with the same plan."""
        self.shutdown()
        if self.last_load is not None:
            self.load(self.last_load)
        else:
            self._ensure_started()

    def shutdown(self) -> None:
        self._timer.stop()
        self.cancel()
        self.remote, self._remote_cancels, self._remote_check = None, {}, None
        engine, self.engine, self.info = self.engine, None, None
        if engine is not None:
            self._engine_finalizer.detach()
            engine.stop(timeout_s=STOP_S)

    def _ensure_started(self) -> None:
        if self.engine is None:
            self.engine = self._spawn()
            # a client dropped without shutdown() (a window deleted unclosed) still ends its engine
            self._engine_finalizer = weakref.finalize(self, self.engine.stop, STOP_S)
            self._timer.start()

    def _check_remote(self, remote: RemoteModel, events: queue.Queue) -> None:
        try:
            check_remote(remote)
        except UserError as error:
            events.put(Error(ErrorKind.LOAD, str(error)))
            return
        except Exception as error:  # an answer that is not the API's: said, not a thread that dies unheard
            events.put(Error(ErrorKind.LOAD, f"{remote.base_url} gave an answer that cannot be read "
                                             f"({first_line(error)})"))
            return
        events.put(remote)

    def _take_remote_answer(self) -> None:
        remote, answer = self._remote_check
        try:
            event = answer.get_nowait()
        except queue.Empty:
            return
        self._remote_check = None
        if isinstance(event, Error):
            if self.engine is None and self.remote is None:
                self._timer.stop()
            self.remote_failed.emit(event.message)
            return
        self.shutdown()
        self.remote, self.last_load, self._remote_events = remote, None, queue.Queue()
        self._timer.start()
        self.info = remote
        self.loaded.emit(remote)

    def _pump(self) -> None:
        if self._remote_check is not None:
            self._take_remote_answer()
        engine = self.engine
        source = engine.events if engine is not None else self._remote_events
        batch: list[Tokens] = []
        drained = False
        for _ in range(MAX_EVENTS_PER_FRAME):
            try:
                event = source.get_nowait()
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
        if engine is None:
            return
        exitcode = engine.process.exitcode
        if drained and exitcode is not None and self.engine is engine:
            self._timer.stop()
            self._engine_finalizer.detach()
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
            self._remote_cancels.pop(event.request_id, None)
            self.finished.emit(event)
        elif isinstance(event, Error):
            self._remote_cancels.pop(event.request_id, None)
            self.error.emit(event)
