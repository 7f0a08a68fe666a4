"""Prefill and decode of one sequence as a generator of events: the scheduler's loop, alone."""

from collections.abc import Iterator

from app.engine.generation.sampling import Sampler
from app.engine.generation.scheduler import Sequence, run_alone
from app.engine.runner.step_runner import StepRunner
from app.engine.text.answer_events import AnswerEvents
from app.protocol.events import Done, Tokens


def generate(
    runner: StepRunner,
    prompt_ids: list[int],
    sampler: Sampler,
    max_new_tokens: int,
    stop_ids: list[int],
    answer: AnswerEvents | None = None,
) -> Iterator[Tokens | Done]:
    """A new sequence over the runner's cache: yield one `Tokens` per step, then `Done` with the statistics
    of the whole generation, made by `answer` (by default: request 0, token ids without text)."""
    answer = answer or AnswerEvents()
    sequence = Sequence(answer.request_id, prompt_ids, runner, sampler, max_new_tokens, stop_ids, answer=answer)
    return run_alone(runner.model, sequence)
