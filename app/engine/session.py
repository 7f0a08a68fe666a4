"""One request end to end: prompt (text, chat or raw ids) -> tokens -> reasoning/answer text."""

from collections.abc import Iterator
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path

from app.engine.generation.checks import check_prompt
from app.engine.generation.generate import generate
from app.engine.generation.sampling import Sampler, SamplingParams
from app.engine.loader import LoadedModel, load_model
from app.engine.runner.step_runner import StepRunner
from app.engine.spec.dflash import DFlashSpeculation
from app.engine.spec.drafter import Speculation
from app.engine.spec.generate import speculative_generate
from app.engine.spec.mtp import MtpSpeculation
from app.engine.spec.options import SpecOptions
from app.engine.text.answer_events import AnswerEvents
from app.engine.text.tokenizer import ChatTokenizer
from app.errors import UserError
from app.model_folder import ModelFolder
from app.plan import ModelFacts
from app.protocol.events import Done, Tokens
from app.protocol.kinds import PieceKind
from app.protocol.stats import stats_dict

NO_SPECULATION = SpecOptions()


@dataclass(frozen=True)
class Prompt:
    """Exactly one of: raw `token_ids`, plain `text`, or chat `messages` rendered by the template."""

    token_ids: list[int] | None = None
    text: str | None = None
    messages: list[dict] | None = None
    reasoning_effort: str | None = None


def prompt_ids(tokenizer: ChatTokenizer | None, prompt: Prompt) -> list[int]:
    if prompt.token_ids is not None:
        return list(prompt.token_ids)
    if tokenizer is None:
        raise UserError("this model folder has no tokenizer.json: pass token ids with --prompt-ids")
    if prompt.messages is not None:
        return tokenizer.render_chat(prompt.messages, prompt.reasoning_effort)
    return tokenizer.encode(prompt.text or "")


class Session:
    """A loaded model and its tokenizer (and drafter, when it speculates), answering one request at a time."""

    def __init__(self, loaded: LoadedModel, tokenizer: ChatTokenizer | None, speculation: Speculation | None = None):
        self.loaded = loaded
        self.tokenizer = tokenizer
        self.speculation = speculation

    @classmethod
    def load(
        cls, path: str | Path, spec: SpecOptions = NO_SPECULATION, context: int = 4096, dtype: str = "bfloat16",
        gpu_budget: int | None = None, **load_options,
    ) -> "Session":
        """Load a model with a fixed context (the desktop app and the server)."""
        folder = ModelFolder.open(path)
        speculation = open_speculation(spec, folder)
        loaded = load_with_speculation(folder, speculation, context, dtype, gpu_budget, **load_options)
        return cls(loaded, ChatTokenizer.load(folder.path), speculation)

    def prompt_ids(self, prompt: Prompt) -> list[int]:
        ids = prompt_ids(self.tokenizer, prompt)
        check_prompt(ids, self.loaded.model.config.vocab_size)
        if len(ids) >= self.loaded.context:
            raise UserError(
                f"the prompt has {len(ids)} tokens but the context holds {self.loaded.context}: "
                "shorten the chat or load the model with a longer context"
            )
        return ids

    @classmethod
    def open(
        cls, path: str | Path, prompt: Prompt, max_new_tokens: int, spec: SpecOptions = NO_SPECULATION,
        dtype: str = "bfloat16", gpu_budget: int | None = None, **load_options,
    ) -> "tuple[Session, list[int]]":
        """Load a model sized for this prompt: the context holds the prompt and the answer. With
        speculation, the drafter's device bytes come out of `gpu_budget` first."""
        folder = ModelFolder.open(path)
        tokenizer = ChatTokenizer.load(folder.path)
        ids = prompt_ids(tokenizer, prompt)
        if not ids:
            raise UserError("the prompt is empty: give some text or token ids")
        context = len(ids) + max_new_tokens
        speculation = open_speculation(spec, folder)
        loaded = load_with_speculation(folder, speculation, context, dtype, gpu_budget, **load_options)
        check_prompt(ids, loaded.model.config.vocab_size)
        return cls(loaded, tokenizer, speculation), ids

    @cached_property
    def runner(self) -> StepRunner:
        """The session's KV cache, of its whole context, and the passes captured over it: made at the first
        answer, kept for all of them (the server's batch gives each sequence its own instead)."""
        return StepRunner(self.loaded.model, self.loaded.context)

    def generate(self, ids: list[int], sampling: SamplingParams, max_new_tokens: int,
                 request_id: int = 0) -> Iterator[Tokens | Done]:
        runner = self.runner
        answer = self.answer_events(request_id, ids)
        sampler = Sampler(sampling, runner.model.device)
        stop_ids = self.loaded.folder.stop_token_ids()
        drafter = self.speculation.new_drafter(runner.cache.capacity) if self.speculation else None
        if drafter:
            events = speculative_generate(runner, ids, sampler, max_new_tokens, stop_ids, drafter,
                                          self.speculation.block_size, answer=answer)
        else:
            events = generate(runner, ids, sampler, max_new_tokens, stop_ids, answer)
        try:
            yield from events
        finally:  # ended, or cancelled: the drafter's context may serve the next answer
            if drafter:
                self.speculation.release(drafter)

    def answer_events(self, request_id: int, prompt_ids: list[int]) -> AnswerEvents:
        """The events of the answer to `prompt_ids`, with its text when the model has a tokenizer."""
        return AnswerEvents(request_id, self.tokenizer.output_parser(prompt_ids) if self.tokenizer else None)


def open_speculation(spec: SpecOptions, folder: ModelFolder) -> Speculation | None:
    if spec.method == "dflash":
        return DFlashSpeculation(spec.drafter, spec.block_size)
    if spec.method == "mtp":
        return MtpSpeculation(ModelFacts.from_folder(folder), spec.block_size)
    return None


def load_with_speculation(
    folder: ModelFolder, speculation: Speculation | None, context: int, dtype: str,
    gpu_budget: int | tuple[int, ...] | None, **load_options,
) -> LoadedModel:
    """The target, loaded in what the drafter leaves of `gpu_budget`, with the drafter set up beside it."""
    if speculation and isinstance(gpu_budget, tuple):  # the drafter runs beside the dense layers, on the first GPU
        gpu_budget = (speculation.budget_left(gpu_budget[0], context, dtype), *gpu_budget[1:])
    elif speculation:
        gpu_budget = speculation.budget_left(gpu_budget, context, dtype)
    loaded = load_model(folder, context=context, dtype=dtype, gpu_budget=gpu_budget, **load_options)
    if speculation:
        speculation.load(loaded.model)
    return loaded


def collect(events: Iterator[Tokens | Done]) -> dict:
    """The whole answer as the CLI's --json object."""
    token_ids, texts = [], {PieceKind.ANSWER: ""}
    for event in events:
        if isinstance(event, Done):
            return {
                "token_ids": token_ids,
                "text": texts.pop(PieceKind.ANSWER),
                **texts,
                "stop_reason": event.stop_reason,
                "stats": stats_dict(event.stats),
            }
        token_ids += event.token_ids
        for kind, text in event.pieces:
            texts[kind] = texts.get(kind, "") + text
    raise RuntimeError("generation ended without a Done event")

