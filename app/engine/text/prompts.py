"""Prompt ids made on a thread of the engine process: rendering a chat template and tokenizing megabytes
of text take seconds, and the generations decoding meanwhile must not wait for them."""

import queue
import threading
from collections.abc import Callable


class PromptWorker:
    """Makes each request's prompt ids on one thread, in the order asked. `submit(request_id, make)` starts
    `make()`; `result(request_id)` is None until it has finished, then its ids or the exception it raised.
    `wake()` is called after each one finishes (the engine loop may be waiting for it)."""

    def __init__(self, wake: Callable[[], None]):
        self._wake = wake
        self._todo: queue.SimpleQueue = queue.SimpleQueue()
        self._lock = threading.Lock()
        self._wanted: set[int] = set()
        self._results: dict[int, list[int] | Exception] = {}
        self._thread: threading.Thread | None = None

    def submitted(self, request_id: int) -> bool:
        with self._lock:
            return request_id in self._wanted

    def submit(self, request_id: int, make: Callable[[], list[int]]) -> None:
        with self._lock:
            self._wanted.add(request_id)
        if self._thread is None:
            self._thread = threading.Thread(target=self._work, name="prompts", daemon=True)
            self._thread.start()
        self._todo.put((request_id, make))

    def result(self, request_id: int) -> list[int] | Exception | None:
        with self._lock:
            return self._results.get(request_id)

    def forget(self, request_id: int) -> None:
        """Drop the request's ids (taken, or no longer wanted: a job still running is discarded when done)."""
        with self._lock:
            self._wanted.discard(request_id)
            self._results.pop(request_id, None)

    def _work(self) -> None:
        while True:
            request_id, make = self._todo.get()
            try:
                made = make()
            except Exception as error:  # any failure belongs to its request, told when the request is handled
                made = error
            with self._lock:
                if request_id in self._wanted:
                    self._results[request_id] = made
            self._wake()
