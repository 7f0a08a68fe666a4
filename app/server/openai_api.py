"""The OpenAI-compatible HTTP API over one loaded engine: /v1/models, /v1/chat/completions and
/v1/completions, streamed (server-sent events) or not. Each response has an extra `moechat` field with
the generated token ids and the engine's figures (expert cache, speculation, batching).

A generation that fails after its stream has begun ends with an error event ({"error": {...}}, as OpenAI
sends it) instead of a cut connection; while the engine is being restarted every route answers 503."""

import asyncio
import json
from collections.abc import AsyncIterator, Awaitable
from contextlib import asynccontextmanager

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response, StreamingResponse
from starlette.middleware.cors import CORSMiddleware

from app.protocol.kinds import ErrorKind
from app.protocol.requests import Generate
from app.protocol.stats import stats_dict
from app.server.api_errors import ApiError, error_body
from app.server.engine_link import READY, RESTARTING, Busy, EngineLink, EngineUnavailable
from app.server.formats import ChatFormat, CompletionFormat
from app.server.generation import EngineRefused, Generation, Update
from app.server.guard import RequestGuard, policy_for
from app.server.options import ServerOptions
from app.server.requests import (
    ChatRequest,
    CompletionRequest,
    SamplingFields,
    chat_messages,
    check_fields,
    completion_prompt,
)

DISCONNECT_POLL_S = 0.05  # a waiting client's connection is looked at this often (a stream's at once)
RETRY = {"Retry-After": "1"}


def create_app(link: EngineLink, options: ServerOptions) -> FastAPI:
    @asynccontextmanager
    async def lifespan(app: FastAPI):
        link.start()
        yield

    docs = options.docs
    app = FastAPI(title="moechat", lifespan=lifespan, docs_url="/docs" if docs else None,
                  redoc_url="/redoc" if docs else None, openapi_url="/openapi.json" if docs else None)
    if options.cors_origins:
        app.add_middleware(CORSMiddleware, allow_origins=list(options.cors_origins), allow_methods=["GET", "POST"],
                           allow_headers=["authorization", "content-type"])
    app.add_middleware(RequestGuard, policy=policy_for(options.host, options.api_key, options.cors_origins,
                                                       options.max_body))
    model_name = options.model_name

    @app.exception_handler(ApiError)
    async def api_error(request: Request, error: ApiError) -> JSONResponse:
        return error.response()

    @app.exception_handler(RequestValidationError)
    async def invalid_request(request: Request, error: RequestValidationError) -> JSONResponse:
        first = error.errors()[0]
        where = ".".join(str(part) for part in first["loc"] if part != "body")
        message = first["msg"].removeprefix("Value error, ")
        return ApiError(400, f"{where}: {message}" if where else message, param=where or None).response()

    @app.get("/v1/models")
    async def models() -> dict:
        _ready(link)
        return {"object": "list", "data": [{"id": model_name, "object": "model", "created": 0, "owned_by": "moechat"}]}

    @app.get("/v1/moechat/status")
    async def status() -> dict:
        return {"model": model_name, "context": link.info.context if link.info else None, **link.status()}

    @app.post("/v1/chat/completions")
    async def chat(body: ChatRequest, request: Request):
        context = _checked(body, link, model_name)
        max_tokens = body.max_completion_tokens or body.max_tokens or min(options.default_max_tokens, context)
        generate = Generate(0, max_tokens, messages=chat_messages(body), reasoning_effort=body.reasoning_effort,
                            **body.sampling())
        return await _respond(link, generate, body, request, ChatFormat(model_name))

    @app.post("/v1/completions")
    async def completions(body: CompletionRequest, request: Request):
        context = _checked(body, link, model_name)
        generate = Generate(0, body.max_tokens or min(options.default_max_tokens, context),
                            **completion_prompt(body, context), **body.sampling())
        return await _respond(link, generate, body, request, CompletionFormat(model_name), merge_kinds=True)

    return app


def _ready(link: EngineLink) -> None:
    if link.state != READY:
        raise ApiError(503, link.unavailable_reason(), "server_error", RETRY if link.state == RESTARTING else None)


def _checked(body: SamplingFields, link: EngineLink, model_name: str) -> int:
    """The served context, once the request names the served model and its fields are all acceptable."""
    if body.model != model_name:
        raise ApiError(404, f"the model '{body.model}' is not served here; this server serves '{model_name}'",
                       "not_found_error", param="model")
    _ready(link)
    context = link.info.context
    check_fields(body, context)
    return context


async def _respond(link: EngineLink, generate: Generate, body: SamplingFields, request: Request, formatter,
                   merge_kinds: bool = False):
    try:
        generation = Generation(link, generate, body.stops(), merge_kinds)
    except Busy:
        raise ApiError(429, f"the server is busy ({link.max_in_flight} requests in flight): retry shortly",
                       "rate_limit_exceeded", RETRY) from None
    except EngineUnavailable as down:
        raise ApiError(503, str(down), "server_error", RETRY if down.retry else None) from None
    stream = None  # once made, the stream closes the generation
    try:
        first = await _unless_disconnected(request, generation.first())
        if body.stream:
            include_usage = bool((body.stream_options or {}).get("include_usage"))
            stream = _GenerationStream(_events(generation, first, formatter, include_usage), generation)
            return stream
        return await _unless_disconnected(request, _collect(generation, first, formatter))
    except EngineRefused as refused:
        raise _refusal(refused) from None
    except _ClientGone:
        return Response(status_code=499)
    finally:
        if stream is None:
            generation.close("client disconnected")


def _refusal(refused: EngineRefused) -> ApiError:
    """The HTTP error for an engine's Error event."""
    error = refused.error
    if error.kind == ErrorKind.REQUEST:
        return ApiError(400, error.message)
    if error.kind == ErrorKind.UNAVAILABLE:
        return ApiError(503, error.message, "server_error", RETRY)
    return ApiError(500, error.message, "server_error")


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
                                                                           "stats": stats_dict(update.stats)})


async def _and_rest(first: Update, generation: Generation) -> AsyncIterator[Update]:
    yield first
    async for update in generation.updates():
        yield update


async def _events(generation: Generation, first: Update, formatter, include_usage: bool) -> AsyncIterator[str]:
    if formatter.opening:
        yield _sse(formatter.chunk({}, None, {}, role=True))
    try:
        async for update in _and_rest(first, generation):
            extra = {"token_ids": update.token_ids}
            if update.finish_reason:
                extra["stats"] = stats_dict(update.stats)
            yield _sse(formatter.chunk(update.text, update.finish_reason, extra))
    except EngineRefused as refused:
        failure = _refusal(refused)
        yield _sse(error_body(failure.message, failure.kind))
        return
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
