"""Prefill and decode as a generator of events."""

import time
from collections.abc import Iterator

import torch

from app.engine.answer_events import AnswerEvents
from app.engine.runner import StepRunner
from app.engine.sampling import Sampler
from app.errors import UserError
from app.protocol.events import Done, Tokens
from app.protocol.kinds import StopReason
from app.protocol.stats import CacheStats, GenerationStats


def check_prompt(prompt_ids: list[int], vocab_size: int) -> None:
    if not prompt_ids:
        raise UserError("the prompt is empty: give some text or token ids")
    bad = [i for i in prompt_ids if not 0 <= i < vocab_size]
    if bad:
        raise UserError(f"token id {bad[0]} is outside the vocabulary (0 … {vocab_size - 1})")


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
    model = runner.model
    check_prompt(prompt_ids, model.config.vocab_size)
    cache = runner.begin()
    cache.check_room(len(prompt_ids))
    stats_before = model.experts.snapshot()
    started = time.perf_counter()
    with torch.inference_mode():
        runner.prepare([1])
        token = sampler.sample(runner.prefill(prompt_ids))
        first_token_at = time.perf_counter()
        emitted = 1
        while True:
            yield answer.tokens([token])
            reason = stop_reason(token, emitted, max_new_tokens, stop_ids, cache.length, cache.capacity)
            if reason:
                break
            token = sampler.sample(runner.run([token])[0][-1])
            emitted += 1
    expert_cache = model.experts.snapshot().since(stats_before)
    yield from answer.done(reason, generation_stats(len(prompt_ids), emitted, started, first_token_at, expert_cache))


def stop_reason(
    token: int, emitted: int, max_new_tokens: int, stop_ids: list[int], cache_length: int, capacity: int
) -> StopReason | None:
    """Why the generation ends once `token` is out as its `emitted`-th token (the cache then holds
    `cache_length` tokens, the prompt and every emitted token but this one), or None."""
    if token in stop_ids:
        return StopReason.STOP
    if emitted >= max_new_tokens:
        return StopReason.LENGTH
    if cache_length >= capacity:
        return StopReason.CONTEXT
    return None


def generation_stats(prompt_tokens: int, emitted: int, started: float, first_token_at: float,
                     expert_cache: CacheStats) -> GenerationStats:
    """Done's statistics, up to now: `emitted` tokens, the first at `first_token_at` (from the prefill)."""
    decode_seconds = time.perf_counter() - first_token_at
    return GenerationStats(prompt_tokens, emitted - 1, first_token_at - started,
                           (emitted - 1) / decode_seconds if decode_seconds > 0 else 0.0, expert_cache)
