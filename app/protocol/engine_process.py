"""The engine child process and its two queues, as a front door holds them."""

import importlib
import multiprocessing
import os
import signal
import threading
import time
from dataclasses import dataclass

from app.protocol.events import Heartbeat
from app.protocol.requests import Shutdown

HEARTBEAT_S = 1.0  # how often the engine process says it is alive
# The child's main loop, named rather than imported: the front doors' process never loads the engine (torch)
ENGINE_MAIN = ("app.engine.process", "engine_main")


@dataclass
class EngineProcess:
    """A running engine child process and its two queues."""

    process: object  # multiprocessing.Process
    requests: object  # multiprocessing.Queue of requests
    events: object  # multiprocessing.Queue of events

    def send(self, request) -> None:
        self.requests.put(request)

    def stop(self, timeout_s: float = 5.0) -> None:
        if self.process.is_alive():
            self.requests.put(Shutdown())
            self.process.join(timeout_s)
        if self.process.is_alive():
            self.process.kill()
            self.process.join()


def spawn_engine() -> EngineProcess:
    """Start the engine in a fresh `spawn`ed process (torch is imported there, never here)."""
    context = multiprocessing.get_context("spawn")
    requests, events = context.Queue(), context.Queue()
    process = context.Process(target=_run_engine, args=(requests, events), name="moechat-engine", daemon=True)
    process.start()
    return EngineProcess(process, requests, events)


def keep_in_touch(events, parent_pid: int) -> None:
    """From a thread of the engine process: a Heartbeat every HEARTBEAT_S, so that the front door can tell a
    stopped or hung process from a busy one; and the end of the process once its parent is gone (killed:
    no one would ever stop it, and it holds the model's memory)."""

    def beat() -> None:
        while os.getppid() == parent_pid:
            events.put(Heartbeat())
            time.sleep(HEARTBEAT_S)
        os._exit(0)

    threading.Thread(target=beat, name="heartbeat", daemon=True).start()


def _run_engine(requests, events) -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl+C reaches the whole process group: the owner ends this
    keep_in_touch(events, os.getppid())  # before torch is imported, which takes seconds
    module, function = ENGINE_MAIN
    getattr(importlib.import_module(module), function)(requests, events)
