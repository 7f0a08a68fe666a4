"""The tokenizer and chat template of a Hugging Face model folder."""

from collections.abc import Sequence
from functools import partial
from pathlib import Path

from jinja2 import TemplateError
from transformers import AutoTokenizer, PreTrainedTokenizerBase

from app.engine.text.output_parser import HarmonyParser, OutputParser, PlainParser, ThinkParser
from app.errors import UserError

THINK_TOKEN = "<think>"
END_THINK_TOKEN = "</think>"


class ChatTokenizer:
    def __init__(self, tokenizer: PreTrainedTokenizerBase):
        self._tokenizer = tokenizer
        self._vocab = tokenizer.get_vocab()

    @classmethod
    def load(cls, folder: Path) -> "ChatTokenizer | None":
        """None when the folder has no tokenizer.json."""
        if not (folder / "tokenizer.json").is_file():
            return None
        try:
            tokenizer = AutoTokenizer.from_pretrained(str(folder), local_files_only=True)
        # The Rust `tokenizers` library reports a malformed file as a bare Exception.
        except Exception as error:
            raise UserError(f"Cannot read the tokenizer in {folder}: {error}") from error
        return cls(tokenizer)

    @property
    def vocab_size(self) -> int:
        return len(self._tokenizer)

    def encode(self, text: str) -> list[int]:
        return self._tokenizer.encode(text, add_special_tokens=False)

    def decode(self, ids: Sequence[int], skip_special_tokens: bool = False) -> str:
        return self._tokenizer.decode(
            list(ids), skip_special_tokens=skip_special_tokens, clean_up_tokenization_spaces=False
        )

    def render_chat(self, messages: list[dict], reasoning_effort: str | None = None) -> list[int]:
        """The prompt ids for `messages`, ending with the assistant's generation prompt."""
        if self._tokenizer.chat_template is None:
            raise UserError(f"The tokenizer in {self._tokenizer.name_or_path} has no chat template.")
        template_options = {} if reasoning_effort is None else {"reasoning_effort": reasoning_effort}
        try:
            text = self._tokenizer.apply_chat_template(
                messages, add_generation_prompt=True, tokenize=False, **template_options
            )
        except TemplateError as error:  # the template's own raise_exception(), or a template that does not fit
            raise UserError(f"the model's chat template refused these messages: {error}") from None
        return self.encode(text)

    def output_parser(self, prompt_ids: Sequence[int] = ()) -> OutputParser:
        """Pass the ids from `render_chat`: a think-style template may open `<think>` in the prompt."""
        decode_text = partial(self.decode, skip_special_tokens=True)
        if all(token in self._vocab for token in HarmonyParser.CONTROL_TOKENS):
            return HarmonyParser(decode_text, self._vocab)
        think_id, end_think_id = self._vocab.get(THINK_TOKEN), self._vocab.get(END_THINK_TOKEN)
        if think_id is None or end_think_id is None:
            return PlainParser(decode_text)
        last_think = _last_index(prompt_ids, think_id)
        in_reasoning_at_start = last_think > _last_index(prompt_ids, end_think_id)
        return ThinkParser(decode_text, think_id, end_think_id, in_reasoning_at_start)


def _last_index(ids: Sequence[int], token: int) -> int:
    """-1 when `token` is absent."""
    return max((index for index, value in enumerate(ids) if value == token), default=-1)
