"""The OpenAI-compatible HTTP API over one loaded engine: /v1/models, /v1/chat/completions and
/v1/completions, streamed (server-sent events) or not. Each response has an extra `moechat` field with
the generated token ids and the engine's figures (expert cache, speculation, batching)."""

import asyncio
import json
import secrets
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager

from fastapi import Depends, FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response, StreamingResponse
from pydantic import BaseModel, ConfigDict, Field

from app.engine.protocol import Generate
from app.errors import UserError
from app.server.engine_link import Busy, EngineLink
from app.server.formats import ChatFormat, CompletionFormat
from app.server.generation import EngineRefused, Generation, Update

DISCONNECT_POLL_S = 0.05  # a waiting client's connection is looked at this often (a stream's at once)


class ApiError(Exception):
    def __init__(self, status: int, message: str, kind: str = "invalid_request_error", headers: dict | None = None):
        super().__init__(message)
        self.status, self.message, self.kind, self.headers = status, message, kind, headers


class SamplingFields(BaseModel):
    model_config = ConfigDict(extra="ignore")

    model: str
    stream: bool = False
    stream_options: dict | None = None
    max_tokens: int | None = Field(None, ge=1)
    stop: str | list[str] | None = None
    temperature: float = Field(1.0, ge=0.0, le=2.0)
    top_p: float = Field(1.0, gt=0.0, le=1.0)
    seed: int | None = None
    n: int = 1

    def stops(self) -> list[str]:
        return [self.stop] if isinstance(self.stop, str) else list(self.stop or [])


class ChatRequest(SamplingFields):
    messages: list[dict] = Field(min_length=1)
    max_completion_tokens: int | None = Field(None, ge=1)
    reasoning_effort: str | None = None


class CompletionRequest(SamplingFields):
    prompt: str | list[int]
    max_tokens: int | None = Field(16, ge=1)  # OpenAI's default for completions


def create_app(link: EngineLink, model_name: str, context: int, api_key: str | None = None) -> FastAPI:
    @asynccontextmanager
    async def lifespan(app: FastAPI):
        link.start()
        yield

    app = FastAPI(title="moechat", dependencies=[Depends(_key_check(api_key))], lifespan=lifespan)

    @app.exception_handler(ApiError)
    async def api_error(request: Request, error: ApiError) -> JSONResponse:
        return _error_response(error.status, error.message, error.kind, error.headers)

    @app.exception_handler(RequestValidationError)
    async def invalid_request(request: Request, error: RequestValidationError) -> JSONResponse:
        first = error.errors()[0]
        where = ".".join(str(part) for part in first["loc"] if part != "body")
        return _error_response(400, f"{where}: {first['msg']}" if where else first["msg"])

    @app.get("/v1/models")
    async def models() -> dict:
        return {"object": "list", "data": [{"id": model_name, "object": "model", "created": 0, "owned_by": "moechat"}]}

    @app.get("/v1/moechat/status")
    async def status() -> dict:
        return {"model": model_name, "context": context, **link.status()}

    @app.post("/v1/chat/completions")
    async def chat(body: ChatRequest, request: Request):
        _check(body, model_name)
        generate = Generate(0, body.max_completion_tokens or body.max_tokens or context, messages=body.messages,
                            reasoning_effort=body.reasoning_effort, **_sampling(body))
        return await _respond(link, generate, body, request, ChatFormat(model_name))

    @app.post("/v1/completions")
    async def completions(body: CompletionRequest, request: Request):
        _check(body, model_name)
        prompt = {"text": body.prompt} if isinstance(body.prompt, str) else {"token_ids": body.prompt}
        generate = Generate(0, body.max_tokens or context, **prompt, **_sampling(body))
        return await _respond(link, generate, body, request, CompletionFormat(model_name), merge_kinds=True)

    return app


def _key_check(api_key: str | None) -> Callable:
    async def check(request: Request) -> None:
        if api_key is None:
            return
        header = request.headers.get("authorization", "")
        if not header.lower().startswith("bearer "):
            raise ApiError(401, "missing API key: send the header 'Authorization: Bearer <key>'",
                           "authentication_error")
        if not secrets.compare_digest(header[7:].strip().encode(), api_key.encode()):
            raise ApiError(401, "invalid API key", "authentication_error")

    return check


def _check(body: SamplingFields, model_name: str) -> None:
    if body.model != model_name:
        raise ApiError(404, f"the model '{body.model}' is not served here; this server serves '{model_name}'",
                       "not_found_error")
    if body.n != 1:
        raise ApiError(400, "n: only one choice per request is supported (n = 1)")


def _sampling(body: SamplingFields) -> dict:
    return {"temperature": body.temperature, "top_p": body.top_p, "seed": body.seed}


async def _respond(link: EngineLink, generate: Generate, body: SamplingFields, request: Request, formatter,
                   merge_kinds: bool = False):
    try:
        generation = Generation(link, generate, body.stops(), merge_kinds)
    except Busy:
        raise ApiError(429, f"the server is busy ({link.max_in_flight} requests in flight): retry shortly",
                       "rate_limit_exceeded", {"Retry-After": "1"}) from None
    except UserError as error:
        raise ApiError(503, str(error), "server_error") from None
    stream = None  # once made, the stream closes the generation
    try:
        first = await _unless_disconnected(request, generation.first())
        if body.stream:
            include_usage = bool((body.stream_options or {}).get("include_usage"))
            stream = _GenerationStream(_events(generation, first, formatter, include_usage), generation)
            return stream
        return await _unless_disconnected(request, _collect(generation, first, formatter))
    except EngineRefused as refused:
        bad_request = refused.error.kind == "request"
        raise ApiError(400 if bad_request else 500, refused.error.message,
                       "invalid_request_error" if bad_request else "server_error") from None
    except _ClientGone:
        return Response(status_code=499)
    finally:
        if stream is None:
            generation.close("client disconnected")


class _ClientGone(Exception):
    pass


async def _unless_disconnected(request: Request, work: Awaitable):
    """`work`'s result, or _ClientGone when the client disconnects first (looked at every DISCONNECT_POLL_S)."""
    task = asyncio.ensure_future(work)
    while True:
        done, _ = await asyncio.wait({task}, timeout=DISCONNECT_POLL_S)
        if done:
            return task.result()
        if await request.is_disconnected():
            task.cancel()
            raise _ClientGone


async def _collect(generation: Generation, first: Update, formatter) -> dict:
    text: dict[str, str] = {}
    token_ids: list[int] = []
    async for update in _and_rest(first, generation):
        token_ids += update.token_ids
        for kind, piece in update.text.items():
            text[kind] = text.get(kind, "") + piece
    return formatter.whole(text, update.finish_reason, generation.usage, {"token_ids": token_ids,
                                                                           "stats": update.stats})


async def _and_rest(first: Update, generation: Generation) -> AsyncIterator[Update]:
    yield first
    async for update in generation.updates():
        yield update


async def _events(generation: Generation, first: Update, formatter, include_usage: bool) -> AsyncIterator[str]:
    if formatter.opening:
        yield _sse(formatter.chunk({}, None, {}, role=True))
    async for update in _and_rest(first, generation):
        extra = {"token_ids": update.token_ids}
        if update.finish_reason:
            extra["stats"] = update.stats
        yield _sse(formatter.chunk(update.text, update.finish_reason, extra))
    if include_usage:
        yield _sse(formatter.usage_chunk(generation.usage))
    yield "data: [DONE]\n\n"


def _sse(payload: dict) -> str:
    return f"data: {json.dumps(payload)}\n\n"


class _GenerationStream(StreamingResponse):
    """Server-sent events of a generation; when the stream ends early (the client went away) the
    generation is cancelled, so its place in the batch is free before the engine's next step."""

    def __init__(self, content: AsyncIterator[str], generation: Generation):
        super().__init__(content, media_type="text/event-stream", headers={"Cache-Control": "no-cache"})
        self.generation = generation

    async def __call__(self, scope, receive, send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            self.generation.close("client disconnected")


def _error_response(status: int, message: str, kind: str = "invalid_request_error",
                    headers: dict | None = None) -> JSONResponse:
    return JSONResponse({"error": {"message": message, "type": kind, "param": None, "code": None}},
                        status_code=status, headers=headers)
