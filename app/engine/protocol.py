"""Messages between the engine and its front doors (CLI, desktop app, server). No torch here."""

import multiprocessing
import os
import signal
import threading
import time
from dataclasses import dataclass, field

HEARTBEAT_S = 1.0  # how often the engine process says it is alive


@dataclass(frozen=True, slots=True)
class SpecStep:
    """One speculative step: it verified `block_size` positions (the anchor token and block_size - 1
    drafts) in one target pass and kept `accepted` drafts; the expert cache during that step."""

    block_size: int
    accepted: int
    experts_per_layer: float  # distinct experts the step touched, per MoE layer
    hits: int
    misses: int
    bytes_fetched: int
    prefetch_coverage: float
    prefetch_waste: float


@dataclass(frozen=True, slots=True)
class Tokens:
    """Tokens emitted by one decode step, and their text as ("reasoning" | "answer", text) pieces
    once a tokenizer has parsed them. With speculation, `drafted[i]` says whether token i was an
    accepted draft (the last token of a step never is) and `spec` describes the step."""

    token_ids: list[int]
    pieces: list[tuple[str, str]] = field(default_factory=list)
    request_id: int = 0
    drafted: list[bool] = field(default_factory=list)
    spec: SpecStep | None = None


@dataclass(frozen=True, slots=True)
class Done:
    """The end of a generation. stop_reason: "stop" (a stop token), "length" (max new tokens) or
    "context" (the context is full)."""

    stop_reason: str
    stats: dict = field(default_factory=dict)
    request_id: int = 0


# Requests (front door -> engine)


@dataclass(frozen=True, slots=True)
class LoadModel:
    """Load `path` with this plan; `spec` ("off", "dflash" with the `drafter` folder, "mtp" for GLM) and
    `block_size` (None: the cost-aware policy) as in `moechat generate --spec`."""

    path: str
    device: str = "cpu"
    dtype: str = "float32"
    gpu_budget: int | tuple[int, ...] | None = None  # a tuple: one budget per GPU, the experts spread over them
    ram_budget: int | None = None
    context: int = 4096
    spec: str = "off"
    drafter: str | None = None
    block_size: int | None = None
    max_batch: int = 8  # generations decoded together (without speculation)


@dataclass(frozen=True, slots=True)
class Generate:
    """Exactly one of token_ids / text / messages (a chat rendered by the model's template)."""

    request_id: int
    max_new_tokens: int
    token_ids: list[int] | None = None
    text: str | None = None
    messages: list[dict] | None = None
    reasoning_effort: str | None = None
    temperature: float = 0.0
    top_k: int = 0
    top_p: float = 1.0
    seed: int | None = None


@dataclass(frozen=True, slots=True)
class Cancel:
    """Stop generation `request_id` (None: every generation, running or waiting, and a running load); a
    stopped generation ends with Done, stop_reason "cancelled", before the engine's next decode step."""

    request_id: int | None = None


@dataclass(frozen=True, slots=True)
class Shutdown:
    pass


# Events (engine -> front door), besides Tokens and Done


@dataclass(frozen=True, slots=True)
class LoadProgress:
    stage: str
    fraction: float


@dataclass(frozen=True, slots=True)
class Loaded:
    """The model is ready; `info` has the model type, vocabulary size, context and placement."""

    info: dict


@dataclass(frozen=True, slots=True)
class StepStats:
    """Decode figures over the last few steps (sent at most ~10 times a second); `residency[i]` is the
    fraction of the i-th MoE layer's experts resident in the device cache when it was sent."""

    request_id: int
    tokens: int
    seconds: float
    hits: int
    misses: int
    bytes_fetched: int
    prefetch_coverage: float
    prefetch_waste: float
    residency: list[float] = field(default_factory=list)


@dataclass(frozen=True, slots=True)
class Heartbeat:
    """Sent every HEARTBEAT_S by a thread of the engine process, busy or not: silence means it is stopped
    or hung."""


@dataclass(frozen=True, slots=True)
class Error:
    """kind: "load", "request" (bad input), "cancelled", "oom", "internal" (the request raised; the engine
    goes on) or "unavailable" (the engine process died or hung: the front door restarts it); message is one
    readable line."""

    kind: str
    message: str
    request_id: int | None = None


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
    from app.engine.process import engine_main

    engine_main(requests, events)
