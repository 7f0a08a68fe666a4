"""Speculative decoding as a generator of events, like `app.engine.generate.generate`."""

import time
from collections.abc import Iterator
from dataclasses import replace

import torch

from app.engine.answer_events import AnswerEvents
from app.engine.generate import check_prompt, generation_stats, stop_reason
from app.engine.runner import StepRunner
from app.engine.sampling import Sampler
from app.engine.spec.drafter import Drafter
from app.engine.spec.sizer import BlockSizer
from app.engine.spec.step import Speculator
from app.protocol.events import Done, SpecStep, Tokens
from app.protocol.stats import CacheStats, SpecStats


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
    """A new sequence over the runner's cache: yield one `Tokens` per step (with `drafted` and `spec`), then
    `Done` whose stats add `spec`; `answer` makes them, as for `generate`.

    `block_size` forces every step to verify that many positions (fewer when the answer or the context
    ends sooner); None lets the cost-aware policy choose per step, with `fetch_bandwidth` (bytes/s) as
    its first guess of the host-to-device copy speed. The tokens are those `generate` would emit:
    identical when greedy, identically distributed when sampling.
    """
    answer = answer or AnswerEvents()
    model = runner.model
    check_prompt(prompt_ids, model.config.vocab_size)
    cache = runner.begin()
    cache.check_room(len(prompt_ids))
    experts = model.experts
    sizer = None if block_size else BlockSizer(experts, model.config.num_experts_per_tok, drafter.block_size,
                                               fetch_bandwidth)
    block_sizes: list[int] = []
    accepted: list[int] = []
    stats_before = experts.snapshot()
    started = time.perf_counter()
    with torch.inference_mode():
        speculator = Speculator(runner, drafter, sampler)
        token = sampler.sample(speculator.prefill(prompt_ids))
        first_token_at = time.perf_counter()
        emitted = 1
        yield answer.tokens([token])
        reason = stop_reason(token, emitted, max_new_tokens, stop_ids, cache.length, cache.capacity)
        step_end = experts.snapshot()  # nothing touches the cache between two steps: one read per step
        while reason is None:
            room = min(max_new_tokens - emitted, cache.capacity - cache.length, drafter.block_size)
            size = min(block_size, room) if block_size else sizer.choose(room)
            step_before, step_started = step_end, time.perf_counter()
            tokens, kept = speculator.step(token, size)
            seconds = time.perf_counter() - step_started
            step_end = experts.snapshot()
            step = step_end.since(step_before)
            if sizer:
                sizer.record(size, kept, seconds, step.bytes_fetched / experts.store.expert_bytes)
            block_sizes.append(size)
            accepted.append(kept)
            out = []
            for token in tokens:  # the last one out is the next step's anchor
                out.append(token)
                emitted += 1
                reason = stop_reason(token, emitted, max_new_tokens, stop_ids, len(prompt_ids) + emitted - 1,
                                     cache.capacity)
                if reason:
                    break
            yield answer.tokens(out, [i < kept for i in range(len(out))], _spec_step(size, kept, step, experts))
    stats = generation_stats(len(prompt_ids), emitted, started, first_token_at,
                             model.experts.snapshot().since(stats_before))
    spec = SpecStats("fixed" if block_size else "cost-aware", len(block_sizes), block_sizes, accepted,
                     sum(accepted) / len(accepted) if accepted else 0.0)
    yield from answer.done(reason, replace(stats, spec=spec))


def _spec_step(size: int, kept: int, step: CacheStats, experts) -> SpecStep:
    return SpecStep(
        block_size=size,
        accepted=kept,
        experts_per_layer=(step.hits + step.misses) / len(experts.store.layers),
        hits=step.hits,
        misses=step.misses,
        bytes_fetched=step.bytes_fetched,
        prefetch_coverage=step.prefetch_coverage,
        prefetch_waste=step.prefetch_waste,
    )
