"""Streaming parsers: generated token ids in, (reasoning | answer, text) pieces out.

Special tokens are matched by id; only the ids of a message's body are decoded, and never into
half of a multi-byte character.
"""

from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence

from app.protocol.kinds import Piece, PieceKind

REPLACEMENT_CHARACTER = "\ufffd"
HARMONY_CHANNEL_KINDS = {
    "analysis": PieceKind.REASONING, "commentary": PieceKind.REASONING, "final": PieceKind.ANSWER,
}

Decode = Callable[[Sequence[int]], str]


class IncrementalText:
    """The text of one message, handed out as its ids arrive."""

    def __init__(self, decode: Decode):
        self._decode = decode
        self._ids: list[int] = []
        # Decoding from the previous piece's first id rather than from the new ids alone keeps the
        # context that decoders such as SentencePiece's need for leading spaces.
        self._prefix_offset = 0
        self._read_offset = 0

    def append(self, token: int) -> None:
        self._ids.append(token)

    def take(self, final: bool) -> str:
        """The text not handed out yet; a trailing U+FFFD waits for more bytes unless `final`."""
        handed_out = self._decode(self._ids[self._prefix_offset : self._read_offset])
        text = self._decode(self._ids[self._prefix_offset :])
        if len(text) <= len(handed_out) or (text.endswith(REPLACEMENT_CHARACTER) and not final):
            return ""
        self._prefix_offset, self._read_offset = self._read_offset, len(self._ids)
        return text[len(handed_out) :]


class OutputParser(ABC):
    """Subclasses decide where messages begin and end."""

    def __init__(self, decode: Decode, kind: PieceKind):
        self._decode = decode
        self._kind = kind
        self._text = IncrementalText(decode)
        self._pieces: list[Piece] = []

    def feed(self, ids: Sequence[int]) -> list[Piece]:
        for token in ids:
            self._route(token)
        self._hand_out(self._text.take(final=False))
        return self._take_pieces()

    def finish(self) -> list[Piece]:
        self._hand_out(self._text.take(final=True))
        return self._take_pieces()

    @abstractmethod
    def _route(self, token: int) -> None:
        """Append `token` to the current message's text, or act on it as a control token."""

    def _start_message(self, kind: PieceKind) -> None:
        self._hand_out(self._text.take(final=True))
        self._text = IncrementalText(self._decode)
        self._kind = kind

    def _hand_out(self, text: str) -> None:
        if text:
            self._pieces.append((self._kind, text))

    def _take_pieces(self) -> list[Piece]:
        pieces, self._pieces = self._pieces, []
        return pieces


class PlainParser(OutputParser):
    """Everything is the answer."""

    def __init__(self, decode: Decode):
        super().__init__(decode, PieceKind.ANSWER)

    def _route(self, token: int) -> None:
        self._text.append(token)


class ThinkParser(OutputParser):
    """`in_reasoning_at_start`: the chat template already opened `<think>` in the prompt."""

    def __init__(self, decode: Decode, think_id: int, end_think_id: int, in_reasoning_at_start: bool):
        super().__init__(decode, PieceKind.REASONING if in_reasoning_at_start else PieceKind.ANSWER)
        self._think_id = think_id
        self._end_think_id = end_think_id

    def _route(self, token: int) -> None:
        if token == self._think_id:
            self._start_message(PieceKind.REASONING)
        elif token == self._end_think_id:
            self._start_message(PieceKind.ANSWER)
        else:
            self._text.append(token)


class HarmonyParser(OutputParser):
    """`<|start|>role<|channel|>name<|message|>body<|end|>`, repeated; the stream usually begins at `<|channel|>`
    (the prompt ends with `<|start|>assistant`); body text outside any header counts as the answer."""

    HEADER_TOKENS = ("<|start|>", "<|channel|>", "<|constrain|>", "<|message|>")
    TERMINATOR_TOKENS = ("<|end|>", "<|return|>", "<|call|>")
    CONTROL_TOKENS = HEADER_TOKENS + TERMINATOR_TOKENS

    def __init__(self, decode: Decode, token_ids: dict[str, int]):
        """`token_ids` maps every token in CONTROL_TOKENS to its id."""
        super().__init__(decode, PieceKind.ANSWER)
        self._start_id, self._channel_id, self._constrain_id, self._message_id = (
            token_ids[token] for token in self.HEADER_TOKENS
        )
        self._terminator_ids = {token_ids[token] for token in self.TERMINATOR_TOKENS}
        self._header_ids: list[int] | None = None

    def _route(self, token: int) -> None:
        if token == self._message_id:
            self._start_message(self._channel_kind())
            self._header_ids = None
        elif token in self._terminator_ids:
            self._start_message(PieceKind.ANSWER)
            self._header_ids = None
        elif token == self._start_id or (token == self._channel_id and self._header_ids is None):
            self._start_message(PieceKind.ANSWER)
            self._header_ids = [token]
        elif self._header_ids is not None:
            self._header_ids.append(token)
        else:
            self._text.append(token)

    def _channel_kind(self) -> PieceKind:
        header = self._header_ids or []
        if self._channel_id not in header:
            return PieceKind.ANSWER
        name_ids = header[header.index(self._channel_id) + 1 :]
        if self._constrain_id in name_ids:
            name_ids = name_ids[: name_ids.index(self._constrain_id)]
        # A recipient may follow the channel name: "commentary to=functions.get_weather".
        words = self._decode(name_ids).split()
        return HARMONY_CHANNEL_KINDS.get(words[0], PieceKind.ANSWER) if words else PieceKind.ANSWER
