"""Messages between the engine and its front doors (CLI, desktop app, server). No torch here."""

from dataclasses import dataclass, field


@dataclass(frozen=True, slots=True)
class Tokens:
    """Tokens emitted by one decode step, and their text as ("reasoning" | "answer", text) pieces
    once a tokenizer has parsed them."""

    token_ids: list[int]
    pieces: list[tuple[str, str]] = field(default_factory=list)


@dataclass(frozen=True, slots=True)
class Done:
    """The end of a generation. stop_reason: "stop" (a stop token), "length" (max new tokens) or
    "context" (the context is full)."""

    stop_reason: str
    stats: dict = field(default_factory=dict)
