"""The contract's words: why an answer ended, what a piece of text is, what failed. Each is a `str`, so it
travels, compares and serializes (JSON, the chat store) as its value."""

from enum import StrEnum


class StopReason(StrEnum):
    STOP = "stop"  # a stop token
    LENGTH = "length"  # max new tokens
    CONTEXT = "context"  # the context is full
    CANCELLED = "cancelled"
    FILTERED = "content_filter"  # a remote server's content filter ended it

    @property
    def finished(self) -> bool:
        """The answer ended by itself, so it is whole (not stopped, not cut by a remote's filter)."""
        return self in (StopReason.STOP, StopReason.LENGTH, StopReason.CONTEXT)

    @property
    def finish_reason(self) -> str:
        """OpenAI's finish_reason: a full context is a length limit; a cancelled answer (a stop string) a stop."""
        return {StopReason.CONTEXT: "length", StopReason.CANCELLED: "stop"}.get(self, self.value)

    @property
    def words(self) -> str:
        """As an answer's figures say it."""
        return _WORDS[self]

    @classmethod
    def from_finish_reason(cls, finish_reason: str | None) -> "StopReason":
        """A remote server's finish_reason; none, or a tool call (the app sends no tools), is a stop."""
        return {"length": cls.LENGTH, "content_filter": cls.FILTERED}.get(finish_reason, cls.STOP)


_WORDS = {StopReason.STOP: "finished", StopReason.LENGTH: "max tokens reached", StopReason.CONTEXT: "context full",
          StopReason.CANCELLED: "stopped", StopReason.FILTERED: "filtered by the server"}


class PieceKind(StrEnum):
    """What a piece of an answer's text is: the model's reasoning (GLM's <think>, gpt-oss's analysis) or the answer."""

    ANSWER = "answer"
    REASONING = "reasoning"


Piece = tuple[PieceKind, str]


class ErrorKind(StrEnum):
    LOAD = "load"  # the model could not be loaded
    REQUEST = "request"  # bad input: the request was refused
    CANCELLED = "cancelled"  # a load was cancelled
    OOM = "oom"  # out of GPU memory
    INTERNAL = "internal"  # the request raised; the engine goes on with the others
    UNAVAILABLE = "unavailable"  # the engine process died or hung: the front door restarts it
