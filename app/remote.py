"""A remote OpenAI-compatible server (`moechat serve`, vLLM, SGLang …) as the desktop app's backend: the
HTTP client that turns its streamed chat answers into the engine protocol's events. No Qt, no torch;
httpx is imported when first used, so that the window opens without it."""

import json
import time
from collections.abc import Callable
from dataclasses import dataclass

from app.errors import UserError, first_line
from app.protocol.events import Done, Error, Tokens
from app.protocol.kinds import ErrorKind, PieceKind, StopReason
from app.protocol.requests import Generate
from app.protocol.stats import GenerationStats, RemoteStats

CONNECT_TIMEOUT_S = 10.0
DELTA_KEYS = ((PieceKind.REASONING, "reasoning_content"), (PieceKind.ANSWER, "content"))


@dataclass(frozen=True)
class RemoteModel:
    base_url: str  # up to and including /v1, e.g. http://gpu-box:8000/v1
    model: str
    api_key: str = ""

    @property
    def name(self) -> str:
        return self.model

    @property
    def headers(self) -> dict:
        return {"Authorization": f"Bearer {self.api_key}"} if self.api_key else {}

    def url(self, path: str) -> str:
        return self.base_url.rstrip("/") + path


def check_remote(remote: RemoteModel) -> None:
    """The server answers, accepts the key and serves the model; else a UserError saying which not."""
    import httpx

    if not remote.base_url.startswith(("http://", "https://")):
        raise UserError(f"'{remote.base_url}' is not a server address: give one like http://127.0.0.1:8000/v1")
    try:
        response = httpx.get(remote.url("/models"), headers=remote.headers, timeout=CONNECT_TIMEOUT_S)
    except httpx.HTTPError as error:
        raise UserError(f"cannot reach {remote.base_url}: {error}") from None
    if response.status_code != 200:
        raise UserError(f"{remote.base_url} answered {response.status_code}: {error_message(response)}")
    served = [entry.get("id") for entry in response.json().get("data", [])]
    if remote.model not in served:
        raise UserError(f"{remote.base_url} does not serve '{remote.model}'; it serves: {', '.join(served) or 'none'}")


def error_message(response) -> str:  # an httpx.Response
    """The server's words for a failed request (OpenAI's {"error": {"message": ...}}), else its body."""
    try:
        return response.json()["error"]["message"]
    except (ValueError, KeyError, TypeError):
        return response.text[:200] or response.reason_phrase


def stream_chat(remote: RemoteModel, request: Generate, emit: Callable[[object], None],
                cancelled: Callable[[], bool]) -> None:
    """Run `request` (its messages and sampling) on the remote, streamed: `emit` gets a `Tokens` per chunk
    (token ids only when the server is moechat and says them), then `Done` (with `RemoteStats`) or `Error`.
    `cancelled()` is looked at between chunks; then the connection closes, which stops the generation on the
    server."""
    import httpx

    body = {"model": remote.model, "messages": request.messages, "max_tokens": request.max_new_tokens,
            "temperature": request.temperature, "top_p": request.top_p, "stream": True,
            "stream_options": {"include_usage": True}}
    if request.seed is not None:
        body["seed"] = request.seed
    if request.reasoning_effort is not None:
        body["reasoning_effort"] = request.reasoning_effort
    answer = _RemoteAnswer(request.request_id, emit)
    try:
        with httpx.stream("POST", remote.url("/chat/completions"), json=body, headers=remote.headers,
                          timeout=httpx.Timeout(CONNECT_TIMEOUT_S, read=None)) as response:
            if response.status_code != 200:
                response.read()
                emit(Error(ErrorKind.REQUEST, f"the remote server refused: {error_message(response)}",
                           request.request_id))
                return
            for line in response.iter_lines():
                if cancelled():
                    emit(Done(StopReason.CANCELLED, answer.stats(), request.request_id))
                    return
                if line.startswith("data: ") and line != "data: [DONE]":
                    answer.read(json.loads(line[len("data: "):]))
    except httpx.HTTPError as error:
        emit(Error(ErrorKind.INTERNAL, f"the connection to {remote.base_url} failed: {error}", request.request_id))
        return
    except (ValueError, KeyError, TypeError, AttributeError) as error:
        emit(Error(ErrorKind.INTERNAL, f"{remote.base_url} sent a chunk that cannot be read ({first_line(error)})",
                   request.request_id))
        return
    emit(Done(StopReason.from_finish_reason(answer.finish_reason), answer.stats(), request.request_id))


class _RemoteAnswer:
    """What the chunks of one streamed answer said: text and token ids (emitted as they come), the usage, the
    finish reason, and a moechat server's figures."""

    def __init__(self, request_id: int, emit: Callable[[object], None]):
        self.request_id, self.emit = request_id, emit
        self.started = time.perf_counter()
        self.ttft_s: float | None = None
        self.usage: dict = {}
        self.engine: GenerationStats | None = None
        self.finish_reason: str | None = None

    def read(self, chunk: dict) -> None:
        extra = chunk.get("moechat") or {}
        if extra.get("stats"):
            self.engine = GenerationStats.from_dict(extra["stats"])
        self.usage = chunk.get("usage") or self.usage
        if not chunk.get("choices"):
            return
        if self.ttft_s is None:
            self.ttft_s = time.perf_counter() - self.started
        choice = chunk["choices"][0]
        delta = choice.get("delta") or {}
        pieces = [(kind, delta[key]) for kind, key in DELTA_KEYS if delta.get(key)]
        token_ids = extra.get("token_ids") or []
        if pieces or token_ids:
            self.emit(Tokens(list(token_ids), pieces, self.request_id))
        self.finish_reason = choice.get("finish_reason") or self.finish_reason

    def stats(self) -> RemoteStats:
        return RemoteStats(self.usage.get("completion_tokens"), self.usage.get("prompt_tokens"), self.ttft_s,
                           self.engine)
