"""The bodies of /v1/chat/completions and /v1/completions, checked before anything reaches the engine:
ranges (temperature, top-p, top-k, seed, max_tokens within the context), text that can be tokenized,
stop strings, messages, and the OpenAI fields this server does not implement, which are refused with a
400 rather than ignored. Message content given as a list of text parts is joined into one text."""

from collections.abc import Callable

from pydantic import BaseModel, ConfigDict, Field

from app.errors import UserError
from app.request_limits import check_seed, check_temperature, check_text, check_top_k, check_top_p
from app.server.api_errors import ApiError

MAX_STOPS = 4  # as OpenAI
MAX_STOP_CHARS = 256  # a stop string is looked for at every token: long ones would stall every stream
MAX_TOKEN_ID = 1 << 31
ROLES = ("system", "developer", "user", "assistant")
REASONING_EFFORTS = ("low", "medium", "high")
# OpenAI fields with an effect this server does not implement, and the values that ask for nothing
NOT_IMPLEMENTED = {
    "logprobs": (None, False), "top_logprobs": (None, 0), "tools": (None, []), "tool_choice": (None, "none", "auto"),
    "functions": (None, []), "function_call": (None, "none", "auto"), "response_format": (None, {"type": "text"}),
    "logit_bias": (None, {}), "presence_penalty": (None, 0, 0.0), "frequency_penalty": (None, 0, 0.0),
    "audio": (None,), "modalities": (None, ["text"]), "prediction": (None,), "web_search_options": (None,),
    "echo": (None, False), "suffix": (None, ""), "best_of": (None, 1),
}
BOOKKEEPING = ("user", "metadata", "store", "service_tier", "parallel_tool_calls", "prompt_cache_key",
               "safety_identifier")  # fields with no effect on the answer


class SamplingFields(BaseModel):
    model_config = ConfigDict(extra="allow")  # other fields are looked at by `check_fields`

    model: str
    stream: bool = False
    stream_options: dict | None = None
    max_tokens: int | None = Field(None, ge=1)
    stop: str | list[str] | None = None
    temperature: float | None = None
    top_p: float | None = None
    top_k: int = 0  # not OpenAI's, as vLLM's: 0 is no limit
    seed: int | None = None
    n: int = 1

    def stops(self) -> list[str]:
        return [self.stop] if isinstance(self.stop, str) else list(self.stop or [])

    def sampling(self) -> dict:
        """The Generate fields, OpenAI's defaults where the request gives none."""
        return {"temperature": 1.0 if self.temperature is None else self.temperature,
                "top_p": 1.0 if self.top_p is None else self.top_p, "top_k": self.top_k, "seed": self.seed}


class ChatRequest(SamplingFields):
    messages: list = Field(min_length=1)
    max_completion_tokens: int | None = Field(None, ge=1)
    reasoning_effort: str | None = None


class CompletionRequest(SamplingFields):
    prompt: str | list[int]
    max_tokens: int | None = Field(16, ge=1)  # OpenAI's default for completions


def check_fields(body: SamplingFields, context: int) -> None:
    """Refuse fields this server does not implement, and values outside what it samples with."""
    for name, value in (body.model_extra or {}).items():
        if name in NOT_IMPLEMENTED and not any(_same(value, unused) for unused in NOT_IMPLEMENTED[name]):
            raise ApiError(400, f"{name}: this server does not support {name} (leave it out)", param=name)
        if name not in NOT_IMPLEMENTED and name not in BOOKKEEPING:
            raise ApiError(400, f"{name}: this server does not know the field '{name}'", param=name)
    if body.n != 1:
        raise ApiError(400, "n: only one choice per request is supported (n = 1)", param="n")
    checks: dict[str, Callable] = {"temperature": check_temperature, "top_p": check_top_p, "top_k": check_top_k,
                                   "seed": check_seed}
    for name, check in checks.items():
        if getattr(body, name) is not None:
            _checked(name, check, getattr(body, name))
    limit = getattr(body, "max_completion_tokens", None) or body.max_tokens
    if limit is not None and limit > context:
        raise ApiError(400, f"max_tokens: {limit} is more than this server's context ({context} tokens)",
                       param="max_tokens")
    stops = body.stops()
    if len(stops) > MAX_STOPS or any(len(stop) > MAX_STOP_CHARS for stop in stops):
        raise ApiError(400, f"stop: at most {MAX_STOPS} stop strings of at most {MAX_STOP_CHARS} characters",
                       param="stop")
    for stop in stops:
        _checked("stop", check_text, stop)


def chat_messages(body: ChatRequest) -> list[dict]:
    """The messages as the chat template takes them: content as one text (text parts joined by newlines)."""
    if body.reasoning_effort is not None and body.reasoning_effort not in REASONING_EFFORTS:
        raise ApiError(400, f"reasoning_effort: use one of {', '.join(REASONING_EFFORTS)}", param="reasoning_effort")
    return [_message(index, message) for index, message in enumerate(body.messages)]


def completion_prompt(body: CompletionRequest, context: int) -> dict:
    """The Generate fields of the prompt: its text, or its token ids."""
    if isinstance(body.prompt, str):
        return {"text": _checked("prompt", check_text, body.prompt)}
    if not body.prompt or len(body.prompt) >= context:
        raise ApiError(400, f"prompt: give 1 to {context - 1} token ids (the context holds {context})",
                       param="prompt")
    if not all(0 <= token < MAX_TOKEN_ID for token in body.prompt):
        raise ApiError(400, "prompt: token ids are whole numbers from 0", param="prompt")
    return {"token_ids": body.prompt}


def _message(index: int, message) -> dict:
    where = f"messages[{index}]"
    if not isinstance(message, dict) or not isinstance(message.get("role"), str):
        raise ApiError(400, f"{where}: a message is an object with a 'role' and a 'content'", param="messages")
    if message["role"] not in ROLES:
        raise ApiError(400, f"{where}.role: '{message['role']}' is not one this server takes (tools and their "
                            f"results are not supported): use {', '.join(ROLES)}", param="messages")
    unknown = set(message) - {"role", "content", "name"}
    if unknown:
        raise ApiError(400, f"{where}: this server does not support the message field '{sorted(unknown)[0]}'",
                       param="messages")
    content = message.get("content")
    if isinstance(content, list):
        content = "\n".join(_text_part(f"{where}.content[{i}]", part) for i, part in enumerate(content))
    if content is not None and not isinstance(content, str):
        raise ApiError(400, f"{where}.content: give text, or a list of text parts", param="messages")
    if not isinstance(message.get("name", ""), str):
        raise ApiError(400, f"{where}.name: a name is text", param="messages")
    for name in ("content", "name"):
        _checked(f"{where}.{name}", check_text, (content if name == "content" else message.get(name)) or "")
    return {**message, "content": content or ""}


def _text_part(where: str, part) -> str:
    if not isinstance(part, dict) or part.get("type") != "text" or not isinstance(part.get("text"), str):
        kind = part.get("type") if isinstance(part, dict) else type(part).__name__
        raise ApiError(400, f"{where}: this model reads text only ('{kind}' parts are not supported)",
                       param="messages")
    return part["text"]


def _checked(name: str, check: Callable, value):
    try:
        return check(value)
    except UserError as error:
        raise ApiError(400, f"{name}: {error}", param=name) from None


def _same(value, unused) -> bool:
    return type(value) is type(unused) and value == unused
