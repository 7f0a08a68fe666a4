"""A remote OpenAI-compatible server (`moechat serve`, vLLM, SGLang …) as the desktop app's backend: the
HTTP client that turns its streamed chat answers into the engine protocol's events. No Qt, no torch;
httpx is imported when first used, so that the window opens without it."""

import json
import time
from collections.abc import Callable
from dataclasses import dataclass

from app.engine.protocol import Done, Error, Generate, Tokens
from app.errors import UserError

CONNECT_TIMEOUT_S = 10.0
STOP_REASONS = {"stop": "stop", "length": "length"}  # OpenAI finish_reason -> the engine's stop_reason


@dataclass(frozen=True)
class RemoteModel:
    base_url: str  # up to and including /v1, e.g. http://gpu-box:8000/v1
    model: str
    api_key: str = ""

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
    (token ids only when the server is moechat and says them), then `Done` or `Error`. `cancelled()` is
    looked at between chunks; then the connection closes, which stops the generation on the server.

    Done's stats say `remote: True`; `completion_tokens` and `prompt_tokens` are the server's usage figures,
    None when it gives none; a moechat server's own figures (expert cache, speculation) are added as it reports them."""
    import httpx

    body = {"model": remote.model, "messages": request.messages, "max_tokens": request.max_new_tokens,
            "temperature": request.temperature, "top_p": request.top_p, "stream": True,
            "stream_options": {"include_usage": True}}
    if request.seed is not None:
        body["seed"] = request.seed
    if request.reasoning_effort is not None:
        body["reasoning_effort"] = request.reasoning_effort
    stats = {"remote": True, "completion_tokens": None}
    started, finish_reason = time.perf_counter(), None
    try:
        with httpx.stream("POST", remote.url("/chat/completions"), json=body, headers=remote.headers,
                          timeout=httpx.Timeout(CONNECT_TIMEOUT_S, read=None)) as response:
            if response.status_code != 200:
                response.read()
                emit(Error("request", f"the remote server refused: {error_message(response)}", request.request_id))
                return
            for line in response.iter_lines():
                if cancelled():
                    emit(Done("cancelled", stats, request.request_id))
                    return
                if not line.startswith("data: ") or line == "data: [DONE]":
                    continue
                chunk = json.loads(line[len("data: "):])
                if "ttft_s" not in stats and chunk.get("choices"):
                    stats["ttft_s"] = time.perf_counter() - started
                finish_reason = _read_chunk(chunk, stats, request.request_id, emit) or finish_reason
    except httpx.HTTPError as error:
        emit(Error("internal", f"the connection to {remote.base_url} failed: {error}", request.request_id))
        return
    emit(Done(STOP_REASONS.get(finish_reason, finish_reason or "stop"), stats, request.request_id))


def _read_chunk(chunk: dict, stats: dict, request_id: int, emit) -> str | None:
    """Emit a chunk's text; note its usage and moechat figures; its finish reason, if it has one."""
    extra = chunk.get("moechat") or {}
    stats.update(extra.get("stats") or {})
    if chunk.get("usage"):
        stats["completion_tokens"] = chunk["usage"].get("completion_tokens")
        stats["prompt_tokens"] = chunk["usage"].get("prompt_tokens")
    if not chunk.get("choices"):
        return None
    choice = chunk["choices"][0]
    delta = choice.get("delta") or {}
    pieces = [(kind, delta[key]) for kind, key in (("reasoning", "reasoning_content"), ("answer", "content"))
              if delta.get(key)]
    token_ids = extra.get("token_ids") or []
    if pieces or token_ids:
        emit(Tokens(list(token_ids), pieces, request_id))
    return choice.get("finish_reason")
