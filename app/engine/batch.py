"""Continuous batching: several sequences, each with its own KV cache, decoded together so that one
step runs each layer's routed experts once for every sequence's token. A sequence joins between steps
(its prompt is prefilled alone, its first token emitted) and leaves as soon as it ends or is cancelled."""

import time
from dataclasses import dataclass, field, replace

import torch

from app.engine.answer_events import AnswerEvents
from app.engine.generate import check_prompt, generation_stats, stop_reason
from app.engine.runner import StepRunner
from app.engine.sampling import Sampler, SamplingParams
from app.protocol.events import Done, Tokens
from app.protocol.stats import BatchStats, CacheStats, GenerationStats


@dataclass(eq=False)
class Sequence:
    request_id: int
    prompt_tokens: int
    runner: StepRunner  # its own KV cache, and the single-token pass over it for steps where it is alone
    sampler: Sampler
    max_new_tokens: int
    answer: AnswerEvents
    started: float
    token: int = -1  # the last token emitted, the next step's input
    emitted: int = 0
    first_token_at: float = 0.0
    expert_cache: CacheStats = field(default_factory=CacheStats)  # its prefill and every step it was in
    steps: int = 0
    batched_with: int = 0  # sum over its steps of the batch size

    @property
    def cache(self):
        return self.runner.cache


class Batch:
    """The sequences decoding on one loaded model (`session`): at most `max_sequences` at once, whose KV
    caches together hold at most the planned context (the plan reserved that many tokens of KV cache).

    Every call returns the events it produced: `Tokens` per sequence and step, then the end of a
    sequence (`AnswerEvents.done`), whose stats have generate's figures plus `batch` (steps, mean batch
    size). A step's expert-cache work counts in full for each sequence in it.
    """

    def __init__(self, session, max_sequences: int):
        self.session = session
        self.model = session.loaded.model
        self.context = session.loaded.context
        self.stop_ids = session.loaded.folder.stop_token_ids()
        self.max_sequences = max_sequences
        self.sequences: dict[int, Sequence] = {}

    def cache_tokens(self, prompt_tokens: int, max_new_tokens: int) -> int:
        """The KV cache a sequence gets: its prompt and answer, within the context."""
        return min(prompt_tokens + max_new_tokens, self.context)

    def has_room(self, cache_tokens: int) -> bool:
        reserved = sum(s.cache.capacity for s in self.sequences.values())
        return len(self.sequences) < self.max_sequences and reserved + cache_tokens <= self.context

    def join(self, request_id: int, prompt_ids: list[int], sampling: SamplingParams,
             max_new_tokens: int) -> list[Tokens | Done]:
        assert request_id not in self.sequences, f"request {request_id} is already decoding"
        model = self.model
        check_prompt(prompt_ids, model.config.vocab_size)
        capacity = self.cache_tokens(len(prompt_ids), max_new_tokens)
        assert self.has_room(capacity), "no room in the batch: ask has_room first"
        runner = StepRunner(model, capacity)
        runner.cache.check_room(len(prompt_ids))
        sequence = Sequence(request_id, len(prompt_ids), runner, Sampler(sampling, model.device), max_new_tokens,
                            self.session.answer_events(request_id, prompt_ids), time.perf_counter())
        before = model.experts.snapshot()
        with torch.inference_mode():
            sequence.token = sequence.sampler.sample(runner.prefill(prompt_ids))
        sequence.first_token_at = time.perf_counter()
        sequence.expert_cache = model.experts.snapshot().since(before)
        self.sequences[request_id] = sequence
        return self._emit(sequence)

    def step(self) -> list[Tokens | Done]:
        """One decode step of every sequence."""
        sequences = list(self.sequences.values())
        before = self.model.experts.snapshot()
        with torch.inference_mode():
            if len(sequences) == 1:
                alone = sequences[0]
                logits = alone.runner.run([alone.token])[0]
            else:
                tokens = torch.tensor([s.token for s in sequences], device=self.model.device)
                logits = self.model.decode_batch(tokens, [s.cache for s in sequences])  # [N, V]
                self.model.experts.settle()
            next_tokens = [s.sampler.sample(logits[i]) for i, s in enumerate(sequences)]
        work = self.model.experts.snapshot().since(before)
        events = []
        for sequence, token in zip(sequences, next_tokens, strict=True):
            sequence.token = token
            sequence.expert_cache = sequence.expert_cache.plus(work)
            sequence.steps += 1
            sequence.batched_with += len(sequences)
            events += self._emit(sequence)
        return events

    def leave(self, request_id: int) -> GenerationStats | None:
        """Drop a sequence (cancelled): Done's stats of what it did, None if it is not decoding here."""
        sequence = self.sequences.pop(request_id, None)
        return self._stats(sequence) if sequence else None

    def _emit(self, sequence: Sequence) -> list[Tokens | Done]:
        sequence.emitted += 1
        token = sequence.token
        events = [sequence.answer.tokens([token])]
        cache = sequence.cache
        reason = stop_reason(token, sequence.emitted, sequence.max_new_tokens, self.stop_ids, cache.length,
                             cache.capacity)
        if reason:
            del self.sequences[sequence.request_id]
            events += sequence.answer.done(reason, self._stats(sequence))
        return events

    def _stats(self, sequence: Sequence) -> GenerationStats:
        stats = generation_stats(sequence.prompt_tokens, sequence.emitted, sequence.started, sequence.first_token_at,
                                 sequence.expert_cache)
        mean_size = sequence.batched_with / sequence.steps if sequence.steps else 0.0
        return replace(stats, batch=BatchStats(sequence.steps, mean_size))
