"""Prefill and decode of one sequence as a generator of events: the scheduler's loop, alone."""

from collections.abc import Iterator

from app.engine.protocol import Done, Tokens
from app.engine.runner import StepRunner
from app.engine.sampling import Sampler
from app.engine.scheduler import Sequence, run_alone


def generate(
    runner: StepRunner,
    prompt_ids: list[int],
    sampler: Sampler,
    max_new_tokens: int,
    stop_ids: list[int],
) -> Iterator[Tokens | Done]:
    """A new sequence over the runner's cache: yield one `Tokens` per step, then `Done` with the statistics
    of the whole generation."""
    return run_alone(runner.model, Sequence(0, prompt_ids, runner, sampler, max_new_tokens, stop_ids))
