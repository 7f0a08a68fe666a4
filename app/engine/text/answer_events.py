"""The events of one answer, each made whole where it is made: its request id, and the text of its tokens
from the tokenizer's output parser. This is the one place where token ids become text."""

from app.engine.text.output_parser import OutputParser
from app.protocol.events import Done, SpecStep, Tokens
from app.protocol.kinds import StopReason
from app.protocol.stats import GenerationStats


class AnswerEvents:
    """For generation `request_id`; without a `parser` (the model has no tokenizer) tokens come without text."""

    def __init__(self, request_id: int = 0, parser: OutputParser | None = None):
        self.request_id = request_id
        self.parser = parser

    def tokens(self, token_ids: list[int], drafted: list[bool] | None = None, spec: SpecStep | None = None) -> Tokens:
        pieces = self.parser.feed(token_ids) if self.parser else []
        return Tokens(token_ids, pieces, self.request_id, drafted or [], spec)

    def done(self, reason: StopReason, stats: GenerationStats) -> list[Tokens | Done]:
        """The end: the text the parser still held (a character waiting for its last bytes), then Done."""
        held = [Tokens([], self.parser.finish(), self.request_id)] if self.parser else []
        return [*held, Done(reason, stats, self.request_id)]
