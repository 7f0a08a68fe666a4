from itertools import cycle

import pytest

from app.engine.text.output_parser import OutputParser
from app.engine.text.tokenizer import ChatTokenizer
from tests.fixtures.tiny_tokenizer import (
    write_harmony_tokenizer,
    write_plain_tokenizer,
    write_think_tokenizer,
)

REASONING_TEXT = "The user asks for the capital of France. It is Paris 🇫🇷, no doubt."
ANSWER_TEXT = "The capital of France is **Paris** — café au lait? 😀"
HARMONY_STREAM = (
    f"<|channel|>analysis<|message|>{REASONING_TEXT}<|end|>"
    f"<|start|>assistant<|channel|>final<|message|>{ANSWER_TEXT}<|return|>"
)
CHUNKINGS = {"one_token_at_a_time": [1], "uneven_chunks": [3, 1, 4, 1, 5, 9, 2, 6], "all_at_once": [10_000]}


@pytest.fixture(scope="module")
def harmony(tmp_path_factory: pytest.TempPathFactory) -> ChatTokenizer:
    folder = tmp_path_factory.mktemp("harmony")
    write_harmony_tokenizer(folder)
    return ChatTokenizer.load(folder)


@pytest.fixture(scope="module")
def think(tmp_path_factory: pytest.TempPathFactory) -> ChatTokenizer:
    folder = tmp_path_factory.mktemp("think")
    write_think_tokenizer(folder)
    return ChatTokenizer.load(folder)


@pytest.fixture(scope="module")
def plain(tmp_path_factory: pytest.TempPathFactory) -> ChatTokenizer:
    folder = tmp_path_factory.mktemp("plain")
    write_plain_tokenizer(folder)
    return ChatTokenizer.load(folder)


def parse(parser: OutputParser, ids: list[int], chunk_sizes: list[int]) -> list[tuple[str, str]]:
    pieces = []
    start = 0
    for size in cycle(chunk_sizes):
        if start >= len(ids):
            break
        pieces += parser.feed(ids[start : start + size])
        start += size
    return pieces + parser.finish()


def joined(pieces: list[tuple[str, str]]) -> dict[str, str]:
    texts = {"reasoning": "", "answer": ""}
    for kind, text in pieces:
        texts[kind] += text
    return texts


@pytest.mark.parametrize("chunk_sizes", CHUNKINGS.values(), ids=CHUNKINGS.keys())
def test_harmony_stream_splits_into_reasoning_and_answer(harmony: ChatTokenizer, chunk_sizes: list[int]):
    pieces = parse(harmony.output_parser(), harmony.encode(HARMONY_STREAM), chunk_sizes)

    assert joined(pieces) == {"reasoning": REASONING_TEXT, "answer": ANSWER_TEXT}
    kinds = [kind for kind, _ in pieces]
    assert kinds == sorted(kinds, key=["reasoning", "answer"].index)


def test_multi_byte_characters_split_across_tokens_are_never_broken(harmony: ChatTokenizer):
    ids = harmony.encode(HARMONY_STREAM)
    assert any("\ufffd" in harmony.decode([token]) for token in ids), "the emoji must span several tokens"

    pieces = parse(harmony.output_parser(), ids, [1])

    assert all("\ufffd" not in text for _, text in pieces)


def test_a_character_still_incomplete_at_the_end_is_handed_out_by_finish(plain: ChatTokenizer):
    first_byte_of_emoji = plain.encode("😀")[:1]
    parser = plain.output_parser()

    assert parser.feed(first_byte_of_emoji) == []
    assert parser.finish() == [("answer", "\ufffd")]


def test_harmony_commentary_with_recipient_and_constraint_is_reasoning(harmony: ChatTokenizer):
    call = "<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>{}<|call|>"
    arguments = '{"city": "Paris"}'

    pieces = parse(harmony.output_parser(), harmony.encode(call.format(arguments)), [1])

    assert joined(pieces) == {"reasoning": arguments, "answer": ""}


def test_harmony_text_before_any_header_is_the_answer(harmony: ChatTokenizer):
    ids = harmony.encode("Paris.<|end|><|start|>assistant<|channel|>analysis<|message|>Oops<|end|>")

    assert joined(parse(harmony.output_parser(), ids, [2])) == {"reasoning": "Oops", "answer": "Paris."}


def test_harmony_headers_alone_produce_no_text(harmony: ChatTokenizer):
    ids = harmony.encode("<|start|>assistant<|channel|>final")

    assert parse(harmony.output_parser(), ids, [1]) == []


@pytest.mark.parametrize("chunk_sizes", CHUNKINGS.values(), ids=CHUNKINGS.keys())
def test_think_stream_whose_prompt_opened_think(think: ChatTokenizer, chunk_sizes: list[int]):
    prompt = think.render_chat([{"role": "user", "content": "Hi"}])
    generated = think.encode(f"{REASONING_TEXT}</think>{ANSWER_TEXT}")

    pieces = parse(think.output_parser(prompt), generated, chunk_sizes)

    assert joined(pieces) == {"reasoning": REASONING_TEXT, "answer": ANSWER_TEXT}


@pytest.mark.parametrize("chunk_sizes", CHUNKINGS.values(), ids=CHUNKINGS.keys())
def test_think_stream_that_opens_think_itself(think: ChatTokenizer, chunk_sizes: list[int]):
    generated = think.encode(f"<think>{REASONING_TEXT}</think>{ANSWER_TEXT}<|endoftext|>")

    pieces = parse(think.output_parser(), generated, chunk_sizes)

    assert joined(pieces) == {"reasoning": REASONING_TEXT, "answer": ANSWER_TEXT}


def test_pieces_are_handed_out_as_soon_as_their_characters_are_complete(think: ChatTokenizer):
    assert parse(think.output_parser(), think.encode(ANSWER_TEXT), [1]) == [
        ("answer", text) for text in _piece_texts(think, ANSWER_TEXT)
    ]


def test_plain_stream_is_all_answer(plain: ChatTokenizer):
    pieces = parse(plain.output_parser(), plain.encode(REASONING_TEXT), [1])

    assert joined(pieces) == {"reasoning": "", "answer": REASONING_TEXT}


def _piece_texts(tokenizer: ChatTokenizer, text: str) -> list[str]:
    """What one-token feeding should hand out: each token's text, multi-byte characters kept whole."""
    texts, pending = [], []
    for token in tokenizer.encode(text):
        pending.append(token)
        decoded = tokenizer.decode(pending)
        if not decoded.endswith("\ufffd"):
            texts.append(decoded)
            pending = []
    return texts
