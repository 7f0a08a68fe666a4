"""Speculative decoding of one sequence as a generator of events: the scheduler's loop, alone, with a drafter."""

from collections.abc import Iterator

from app.engine.generation.sampling import Sampler
from app.engine.generation.scheduler import Sequence, run_alone
from app.engine.runner.step_runner import StepRunner
from app.engine.spec.drafter import Drafter
from app.engine.text.answer_events import AnswerEvents
from app.protocol.events import Done, Tokens


def speculative_generate(
    runner: StepRunner,
    prompt_ids: list[int],
    sampler: Sampler,
    max_new_tokens: int,
    stop_ids: list[int],
    drafter: Drafter,
    block_size: int | None = None,
    fetch_bandwidth: float | None = None,
    answer: AnswerEvents | None = None,
) -> Iterator[Tokens | Done]:
    """`generate`'s events, Tokens and Done with `spec`. `block_size` None: the cost-aware policy, starting from
    `fetch_bandwidth` (bytes/s). Tokens are identical to `generate`'s when greedy, identically distributed else."""
    answer = answer or AnswerEvents()
    sequence = Sequence(answer.request_id, prompt_ids, runner, sampler, max_new_tokens, stop_ids, answer=answer,
                        drafter=drafter, block_size=block_size, fetch_bandwidth=fetch_bandwidth)
    return run_alone(runner.model, sequence)
