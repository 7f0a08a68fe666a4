"""The two engines the app can chat through, behind one interface: the engine child process on this machine,
or a remote OpenAI-compatible server. No Qt here: `EngineClient` pumps either's events into signals."""

import queue
import signal
import threading
import weakref
from abc import ABC, abstractmethod
from collections.abc import Callable

from app.errors import UserError, first_line
from app.protocol.engine_process import EngineProcess
from app.protocol.events import Error
from app.protocol.kinds import ErrorKind
from app.protocol.requests import Cancel, Generate, LoadModel
from app.remote import RemoteModel, check_remote, stream_chat

STOP_S = 2.0  # how long the engine may take to obey Shutdown before it is killed


class Engine(ABC):
    """What the app asks of the engine it chats through; every answer comes back as protocol events."""

    @abstractmethod
    def generate(self, request: Generate) -> None:
        """Start `request` (its id already set); its Tokens, then Done or Error, will come from `poll`."""

    @abstractmethod
    def cancel(self) -> None:
        """Stop every generation; each still ends with its Done."""

    @abstractmethod
    def poll(self):
        """The next event that has arrived, or None when none has."""

    def exit_reason(self) -> str | None:
        """Why the engine ended by itself, in words, once it has; None while it serves."""
        return None

    @abstractmethod
    def stop(self) -> None:
        """End it: the app shuts it down or changes to another."""


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


class LocalEngine(Engine):
    """The engine child process that `spawn` starts; it also loads models. One dropped without `stop()` (a
    window deleted unclosed) still ends its process."""

    def __init__(self, spawn: Callable[[], EngineProcess]):
        self.process = spawn()
        self._finalizer = weakref.finalize(self, self.process.stop, STOP_S)

    def load(self, request: LoadModel) -> None:
        self.process.send(request)

    def generate(self, request: Generate) -> None:
        self.process.send(request)

    def cancel(self) -> None:
        self.process.send(Cancel())

    def poll(self):
        try:
            return self.process.events.get_nowait()
        except (queue.Empty, OSError, EOFError):
            return None

    def exit_reason(self) -> str | None:
        exitcode = self.process.process.exitcode
        return None if exitcode is None else exit_reason(exitcode)

    def stop(self) -> None:
        self.cancel()
        self._finalizer.detach()
        self.process.stop(timeout_s=STOP_S)


class RemoteEngine(Engine):
    """A remote server serving `remote`: each generation streams over HTTP from its own thread, and their
    events meet on one queue. It has no load progress, step statistics or process to die."""

    def __init__(self, remote: RemoteModel):
        self.remote = remote
        self._events: queue.Queue = queue.Queue()
        self._cancels: dict[int, threading.Event] = {}  # the generations still streaming

    def generate(self, request: Generate) -> None:
        cancelled = self._cancels[request.request_id] = threading.Event()
        threading.Thread(target=self._stream, args=(request, cancelled), daemon=True).start()

    def cancel(self) -> None:
        for cancelled in list(self._cancels.values()):
            cancelled.set()

    def poll(self):
        try:
            return self._events.get_nowait()
        except queue.Empty:
            return None

    def stop(self) -> None:
        self.cancel()

    def _stream(self, request: Generate, cancelled: threading.Event) -> None:
        try:
            stream_chat(self.remote, request, self._events.put, cancelled.is_set)
        finally:
            self._cancels.pop(request.request_id, None)


def check_in_background(remote: RemoteModel) -> queue.Queue:
    """Ask `remote`, on a thread, whether it serves its model: the queue gets `remote` when it does, else an
    Error (kind load) that says why not."""
    answer: queue.Queue = queue.Queue()

    def check() -> None:
        try:
            check_remote(remote)
        except UserError as error:
            answer.put(Error(ErrorKind.LOAD, str(error)))
            return
        except Exception as error:  # an answer that is not the API's: said, not a thread that dies unheard
            answer.put(Error(ErrorKind.LOAD, f"{remote.base_url} gave an answer that cannot be read "
                                             f"({first_line(error)})"))
            return
        answer.put(remote)

    threading.Thread(target=check, daemon=True).start()
    return answer
