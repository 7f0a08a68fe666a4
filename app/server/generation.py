"""One generation through the engine link, as the OpenAI API sees it: text and token updates with stop
strings applied, then a finish reason and the engine's figures."""

from collections.abc import AsyncIterator
from dataclasses import dataclass, field

from app.protocol.events import Done, Error, Tokens
from app.protocol.kinds import PieceKind, StopReason
from app.protocol.requests import Generate
from app.protocol.stats import GenerationStats
from app.server.engine_link import EngineLink
from app.server.stop_text import StopText


class EngineRefused(Exception):
    """The engine answered a generation with an Error event."""

    def __init__(self, error: Error):
        super().__init__(error.message)
        self.error = error


@dataclass
class Update:
    """New text by kind, the new token ids; at the end the finish reason and Done's stats."""

    text: dict[PieceKind, str] = field(default_factory=dict)
    token_ids: list[int] = field(default_factory=list)
    finish_reason: str | None = None
    stats: GenerationStats | None = None


class Generation:
    """Sends `request` through `link`. With `merge_kinds` (completions) all text is one answer; stop strings
    apply to the answer. `close()` must be called when the client is done (it cancels a running generation)."""

    def __init__(self, link: EngineLink, request: Generate, stops: list[str], merge_kinds: bool = False):
        self.link = link
        self.request_id, self._events = link.open(request)
        self.stop = StopText(stops)
        self.merge_kinds = merge_kinds
        self.prompt_tokens = 0
        self.completion_tokens = 0
        self.ended = False

    async def first(self) -> Update:
        """The first update (the prefill's token); raises EngineRefused when the engine refuses the request."""
        return await self._next()

    async def updates(self) -> AsyncIterator[Update]:
        """The updates after `first()`, to the end."""
        while not self.ended:
            yield await self._next()

    def close(self, reason: str) -> None:
        if not self.ended:
            self.link.close(self.request_id, reason)
            self.ended = True

    async def _next(self) -> Update:
        while True:
            event = await self._events.get()
            if isinstance(event, Error):
                self.ended = True
                raise EngineRefused(event)
            if isinstance(event, Done):
                return self._finish(event)
            if isinstance(event, Tokens):
                return self._tokens(event)

    def _tokens(self, event: Tokens) -> Update:
        update = Update(token_ids=list(event.token_ids))
        self.completion_tokens += len(event.token_ids)
        for kind, text in event.pieces:
            kind = PieceKind.ANSWER if self.merge_kinds else kind
            if kind == PieceKind.ANSWER:
                text = self.stop.feed(text)
            update.text[kind] = update.text.get(kind, "") + text
        if self.stop.stopped:  # its Done follows within a step and brings the figures
            self.link.cancel(self.request_id, "stop string")
        return update

    def _finish(self, done: Done) -> Update:
        self.ended = True
        self.prompt_tokens = done.stats.prefill_tokens if done.stats else 0
        reason = StopReason.STOP.finish_reason if self.stop.stopped else done.stop_reason.finish_reason
        return Update(text={PieceKind.ANSWER: self.stop.finish()}, finish_reason=reason, stats=done.stats)

    @property
    def usage(self) -> dict:
        return {"prompt_tokens": self.prompt_tokens, "completion_tokens": self.completion_tokens,
                "total_tokens": self.prompt_tokens + self.completion_tokens}
