import json
from pathlib import Path

import pytest
from tokenizers import Tokenizer

from app.engine.text.output_parser import HarmonyParser, PlainParser, ThinkParser
from app.engine.text.tokenizer import ChatTokenizer
from app.errors import UserError
from tests.fixtures.tiny_tokenizer import (
    MAX_VOCAB_SIZE,
    write_harmony_tokenizer,
    write_plain_tokenizer,
    write_think_tokenizer,
)

UNICODE_TEXT = "Grüße aus Köln, 世界! 😀 def add(a, b):\n    return a + b"
CHAT = [
    {"role": "system", "content": "Be brief."},
    {"role": "user", "content": "What is the capital of France?"},
]


@pytest.fixture
def harmony(tmp_path: Path) -> ChatTokenizer:
    write_harmony_tokenizer(tmp_path / "harmony")
    return ChatTokenizer.load(tmp_path / "harmony")


@pytest.fixture
def think(tmp_path: Path) -> ChatTokenizer:
    write_think_tokenizer(tmp_path / "think")
    return ChatTokenizer.load(tmp_path / "think")


@pytest.fixture
def plain(tmp_path: Path) -> ChatTokenizer:
    write_plain_tokenizer(tmp_path / "plain")
    return ChatTokenizer.load(tmp_path / "plain")


@pytest.mark.parametrize("write", [write_harmony_tokenizer, write_think_tokenizer, write_plain_tokenizer])
def test_fixture_vocabulary_fits_the_tiny_models_and_is_reproducible(tmp_path: Path, write):
    vocab_size = write(tmp_path / "first")
    write(tmp_path / "second")

    assert vocab_size <= MAX_VOCAB_SIZE
    assert ChatTokenizer.load(tmp_path / "first").vocab_size == vocab_size
    first, second = ((tmp_path / name / "tokenizer.json").read_text() for name in ("first", "second"))
    assert first == second


def test_load_without_tokenizer_json_is_none(tmp_path: Path):
    assert ChatTokenizer.load(tmp_path) is None


def test_load_of_a_broken_tokenizer_json_is_a_user_error(tmp_path: Path):
    write_harmony_tokenizer(tmp_path)
    (tmp_path / "tokenizer.json").write_text('{"model": "truncated')

    with pytest.raises(UserError, match="Cannot read the tokenizer"):
        ChatTokenizer.load(tmp_path)


def test_encode_matches_the_tokenizers_library_and_decodes_back(harmony: ChatTokenizer, tmp_path: Path):
    reference = Tokenizer.from_file(str(tmp_path / "harmony" / "tokenizer.json"))

    ids = harmony.encode(UNICODE_TEXT)

    assert ids == reference.encode(UNICODE_TEXT, add_special_tokens=False).ids
    assert harmony.decode(ids) == UNICODE_TEXT


def test_special_tokens_encode_as_single_ids_and_are_skipped_on_request(harmony: ChatTokenizer):
    ids = harmony.encode("<|channel|>final<|message|>Paris")

    assert ids[0] == harmony.encode("<|channel|>")[0]
    assert len(harmony.encode("<|channel|>")) == 1
    assert harmony.decode(ids) == "<|channel|>final<|message|>Paris"
    assert harmony.decode(ids, skip_special_tokens=True) == "finalParis"


def test_render_chat_in_harmony(harmony: ChatTokenizer):
    expected = (
        "<|start|>system<|message|>Be brief.<|end|>"
        "<|start|>user<|message|>What is the capital of France?<|end|>"
        "<|start|>assistant"
    )
    assert harmony.render_chat(CHAT) == harmony.encode(expected)


def test_render_chat_puts_the_reasoning_effort_into_the_harmony_system_message(harmony: ChatTokenizer):
    with_effort = harmony.decode(harmony.render_chat(CHAT, reasoning_effort="high"))
    without_effort = harmony.decode(harmony.render_chat(CHAT))

    assert with_effort.startswith("<|start|>system<|message|>Be brief.\nReasoning: high<|end|>")
    assert "Reasoning" not in without_effort


def test_render_chat_in_think_style(think: ChatTokenizer):
    expected = "<|system|>\nBe brief.<|user|>\nWhat is the capital of France?<|assistant|><think>"
    assert think.render_chat(CHAT) == think.encode(expected)


def test_render_chat_reads_a_chat_template_jinja_file(tmp_path: Path):
    write_harmony_tokenizer(tmp_path)
    config_path = tmp_path / "tokenizer_config.json"
    config = json.loads(config_path.read_text())
    (tmp_path / "chat_template.jinja").write_text(config.pop("chat_template"))
    config_path.write_text(json.dumps(config))
    from_file = ChatTokenizer.load(tmp_path)

    assert from_file.render_chat(CHAT) == from_file.encode(
        "<|start|>system<|message|>Be brief.<|end|>"
        "<|start|>user<|message|>What is the capital of France?<|end|><|start|>assistant"
    )


def test_render_chat_without_a_template_is_a_user_error(plain: ChatTokenizer):
    with pytest.raises(UserError, match="no chat template"):
        plain.render_chat(CHAT)


def test_output_parser_matches_the_chat_format(harmony, think, plain: ChatTokenizer):
    assert isinstance(harmony.output_parser(), HarmonyParser)
    assert isinstance(think.output_parser(), ThinkParser)
    assert isinstance(plain.output_parser(), PlainParser)


def test_think_parser_starts_in_reasoning_when_the_prompt_left_think_open(think: ChatTokenizer):
    opened_prompt = think.render_chat(CHAT)
    closed_prompt = think.encode("<|user|>\nHi<|assistant|><think></think>Hello<|user|>\nAgain<|assistant|>")
    generated = think.encode("Paris.")

    assert think.output_parser(opened_prompt).feed(generated) == [("reasoning", "Paris.")]
    assert think.output_parser(closed_prompt).feed(generated) == [("answer", "Paris.")]
    assert think.output_parser().feed(generated) == [("answer", "Paris.")]
