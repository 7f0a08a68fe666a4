"""One loop for every generation: sequences, plain or speculative, alone or together.

A sequence joins between steps (prompt prefilled alone) and leaves when it ends. Each step drafts a block per
speculative sequence ([anchor, *drafts]; plain: its last token), runs one target pass over all blocks (alone: the
runner's, a CUDA graph where possible; together: `forward_batch`), then accepts and rewinds each on its own. A
sequence alone over a complete expert cache runs its plain passes one ahead of the host (ahead.py): every pass of a
plain sequence, a speculative one's while its policy holds plain steps.
"""

import time
from collections.abc import Iterator
from dataclasses import dataclass, field, replace

import torch

from app.engine.generation.ahead import AheadPass
from app.engine.generation.checks import check_prompt, generation_stats, stop_reason
from app.engine.generation.sampling import Sampler
from app.engine.runner.step_runner import StepRunner
from app.engine.spec.drafter import Drafter, Proposal
from app.engine.spec.sizer import BlockSizer
from app.engine.spec.step import Speculator
from app.engine.text.answer_events import AnswerEvents
from app.protocol.events import Done, SpecStep, Tokens
from app.protocol.stats import BatchStats, CacheStats, GenerationStats, SpecStats


@dataclass(eq=False)
class Sequence:
    """One generation. Without a forced `block_size` a drafter's block follows the cost-aware policy, which learns
    from the steps the sequence runs alone. `answer` makes its events (default: token ids without text)."""

    request_id: int
    prompt_ids: list[int]
    runner: StepRunner
    sampler: Sampler
    max_new_tokens: int
    stop_ids: list[int]
    answer: AnswerEvents | None = None
    drafter: Drafter | None = None
    block_size: int | None = None
    fetch_bandwidth: float | None = None  # the policy's first guess of the copy speed, bytes/s
    started: float = field(default_factory=time.perf_counter)
    token: int = -1  # the last token emitted: the next step's input (its anchor)
    emitted: int = 0
    first_token_at: float = 0.0
    expert_cache: CacheStats = field(default_factory=CacheStats)  # its prefill and every step it was in
    steps: int = 0
    batched_with: int = 0  # sum over its steps of the batch size
    block_sizes: list[int] = field(default_factory=list)
    accepted: list[int] = field(default_factory=list)
    speculator: Speculator | None = None
    sizer: BlockSizer | None = None
    ahead: AheadPass | None = None  # its pass queued from `token`, whose own token the host has not read
    read_at: float = 0.0  # when the host last read a token ahead

    def __post_init__(self):
        self.answer = self.answer or AnswerEvents(self.request_id)

    @property
    def cache(self):
        return self.runner.cache

    @property
    def capture(self) -> tuple[int, ...]:
        return self.speculator.capture if self.speculator else ()


@dataclass
class _Plan:
    """One step's block for a sequence and the proposal behind its drafts."""

    block: list[int]
    proposal: Proposal | None = None


class Scheduler:
    """`join` and `step` return the events they produced; Done's stats add `spec` for a speculative sequence and,
    with `batch_stats`, `batch`. A step's expert-cache work counts in full for each sequence in it."""

    def __init__(self, model, batch_stats: bool = False):
        self.model = model
        self.batch_stats = batch_stats
        self.sequences: dict[int, Sequence] = {}
        self._cache_stats = model.experts.snapshot()  # read once a step: with every expert resident a read syncs

    def join(self, sequence: Sequence) -> list[Tokens | Done]:
        model = self.model
        assert sequence.request_id not in self.sequences, f"request {sequence.request_id} is already decoding"
        events = self._catch_up()
        check_prompt(sequence.prompt_ids, model.config.vocab_size)
        sequence.runner.begin().check_room(len(sequence.prompt_ids))
        before = model.experts.snapshot()
        with torch.inference_mode():
            if sequence.drafter is None:
                sequence.runner.prepare([1])
                logits = sequence.runner.prefill(sequence.prompt_ids)
            else:
                sequence.speculator = Speculator(sequence.runner, sequence.drafter, sequence.sampler)
                if sequence.block_size is None:
                    sequence.sizer = BlockSizer(model.experts, model.config.num_experts_per_tok,
                                                sequence.drafter.block_size, sequence.fetch_bandwidth)
                logits = sequence.speculator.prefill(sequence.prompt_ids)
            sequence.token = sequence.sampler.sample(logits)
        sequence.first_token_at = time.perf_counter()
        self._cache_stats = model.experts.snapshot()
        sequence.expert_cache = self._cache_stats.since(before)
        self.sequences[sequence.request_id] = sequence
        return events + self._emit(sequence, [sequence.token], 0, None)

    def step(self) -> list[Tokens | Done]:
        sequences = list(self.sequences.values())
        if len(sequences) == 1 and _runs_ahead(sequences[0]):
            with torch.inference_mode():
                return self._step_ahead(sequences[0])
        experts = self.model.experts
        before, started = self._cache_stats, time.perf_counter()
        with torch.inference_mode():
            plans = [self._plan(sequence) for sequence in sequences]
            outputs = self._target_pass(sequences, plans)
            results = [self._accept(sequence, plan, logits, features)
                       for sequence, plan, (logits, features) in zip(sequences, plans, outputs, strict=True)]
        seconds = time.perf_counter() - started
        self._cache_stats = experts.snapshot()
        work = self._cache_stats.since(before)
        events = []
        for sequence, plan, (tokens, kept) in zip(sequences, plans, results, strict=True):
            _count_step(sequence, work, len(sequences))
            # what a step costs is learnt from the steps run alone
            spec = _spec_step(sequence, len(plan.block), kept, work, experts, seconds if len(sequences) == 1 else None)
            events += self._emit(sequence, tokens, kept, spec)
        return events

    def leave(self, request_id: int) -> GenerationStats | None:
        """-> Done's stats of what it did, None if it is not decoding here."""
        sequence = self.sequences.pop(request_id, None)
        if sequence is None:
            return None
        return self._stats(sequence)

    def _step_ahead(self, sequence: Sequence) -> list[Tokens | Done]:
        """Queues the pass from the token ahead (unless that token surely ends the sequence or the step after
        this one may draft), then reads it."""
        ahead = sequence.ahead or AheadPass(sequence.runner, sequence.sampler,
                                            torch.tensor([sequence.token], device=self.model.device), sequence.capture)
        following = None
        if (sequence.emitted + 1 < sequence.max_new_tokens and sequence.cache.length < sequence.cache.capacity
                and (sequence.speculator is None or sequence.sizer.holds_plain(steps=1))):
            following = AheadPass(sequence.runner, sequence.sampler, ahead.token, sequence.capture)
        return self._read_ahead(sequence, ahead, following)

    def _catch_up(self) -> list[Tokens | Done]:
        """Every token ahead read and emitted: each sequence's next input is on the host again."""
        events = []
        for sequence in list(self.sequences.values()):
            if sequence.ahead is not None:
                events += self._read_ahead(sequence, sequence.ahead, None)
        return events

    def _read_ahead(self, sequence: Sequence, ahead: AheadPass, following: AheadPass | None) -> list[Tokens | Done]:
        token, stats = ahead.read()
        work = stats.since(self._cache_stats)
        _count_step(sequence, work, 1)
        self._cache_stats = stats
        sequence.ahead = None
        spec = None
        if sequence.speculator:  # the pass's input joins the drafter's context, as a plain verify's would
            sequence.drafter.commit([sequence.token], ahead.features)
            read_at = time.perf_counter()
            # from the last read (or its queueing, if later): a plain step's cost while passes run back to back
            spec = _spec_step(sequence, 1, 0, work, self.model.experts,
                              read_at - max(ahead.queued_at, sequence.read_at))
            sequence.read_at = read_at
        events = self._emit(sequence, [token], 0, spec)
        if sequence.request_id in self.sequences:
            sequence.ahead = following
        elif following is not None:  # it ended at a stop token: the pass queued after it is nobody's
            sequence.cache.truncate(sequence.cache.length - 1)
        return events

    def _plan(self, sequence: Sequence) -> _Plan:
        if sequence.speculator is None:
            return _Plan([sequence.token])
        room = min(sequence.max_new_tokens - sequence.emitted, sequence.cache.capacity - sequence.cache.length,
                   sequence.drafter.block_size)
        size = min(sequence.block_size, room) if sequence.block_size else sequence.sizer.choose(room)
        return _Plan(*sequence.speculator.draft(sequence.token, size))

    def _target_pass(self, sequences: list[Sequence], plans: list[_Plan]) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """Per sequence (logits [B, V], features [B, F], empty without a drafter); alone, features are copied out
        of the graph because the drafter keeps them."""
        if len(sequences) == 1:
            (sequence,), (plan,) = sequences, plans
            logits, features = sequence.runner.run(plan.block, sequence.capture)
            return [(logits, features.clone() if sequence.speculator else None)]
        capture = sequences[0].capture
        device = self.model.device
        blocks = [torch.tensor(plan.block, device=device) for plan in plans]
        out = self.model.forward_batch(blocks, [sequence.cache for sequence in sequences], capture=capture)
        self.model.experts.settle()
        logits, features = out if capture else (out, None)
        lengths = [len(plan.block) for plan in plans]
        return list(zip(logits.split(lengths), features.split(lengths) if capture else [None] * len(lengths),
                        strict=True))

    def _accept(self, sequence: Sequence, plan: _Plan, logits: torch.Tensor,
                features: torch.Tensor | None) -> tuple[list[int], int]:
        if sequence.speculator is None:
            return [sequence.sampler.sample(logits[-1])], 0
        return sequence.speculator.accept(plan.block, plan.proposal, logits, features)

    def _emit(self, sequence: Sequence, tokens: list[int], kept: int, spec: SpecStep | None) -> list[Tokens | Done]:
        """Tokens up to the first that ends the sequence; the last one out is the next step's anchor."""
        out, reason = [], None
        for token in tokens:
            out.append(token)
            sequence.emitted += 1
            reason = stop_reason(token, sequence.emitted, sequence.max_new_tokens, sequence.stop_ids,
                                 len(sequence.prompt_ids) + sequence.emitted - 1, sequence.cache.capacity)
            if reason:
                break
        sequence.token = out[-1]
        drafted = [i < kept for i in range(len(out))] if spec else None
        events = [sequence.answer.tokens(out, drafted, spec)]
        if reason:
            del self.sequences[sequence.request_id]
            events += sequence.answer.done(reason, self._stats(sequence))
        return events

    def _stats(self, sequence: Sequence) -> GenerationStats:
        stats = generation_stats(len(sequence.prompt_ids), sequence.emitted, sequence.started,
                                 sequence.first_token_at, sequence.expert_cache)
        spec = None
        if sequence.speculator:
            accepted = sequence.accepted
            spec = SpecStats("fixed" if sequence.block_size else "cost-aware", len(sequence.block_sizes),
                             sequence.block_sizes, accepted, sum(accepted) / len(accepted) if accepted else 0.0)
        mean_size = sequence.batched_with / sequence.steps if sequence.steps else 0.0
        return replace(stats, spec=spec, batch=BatchStats(sequence.steps, mean_size) if self.batch_stats else None)


def _count_step(sequence: Sequence, work: CacheStats, batch_size: int) -> None:
    """A step's expert-cache work and its batch's size, counted for a sequence that was in it."""
    sequence.expert_cache = sequence.expert_cache.plus(work)
    sequence.steps += 1
    sequence.batched_with += batch_size


def _runs_ahead(sequence: Sequence) -> bool:
    """Whether a lone sequence's next step is a pass run ahead of the host (or the read of one queued)."""
    if not sequence.runner.runs_ahead:
        return False
    if sequence.speculator is None or sequence.ahead is not None:
        return True
    return sequence.sizer is not None and sequence.sizer.holds_plain()


def _spec_step(sequence: Sequence, size: int, kept: int, step: CacheStats, experts,
               seconds: float | None) -> SpecStep | None:
    """A speculative sequence's step of `size` positions, `kept` drafts, recorded (the policy learns from its
    `seconds` unless None) -> its event's spec; None for a plain sequence."""
    if sequence.speculator is None:
        return None
    if sequence.sizer and seconds is not None:
        sequence.sizer.record(size, kept, seconds, step.bytes_fetched / experts.store.expert_bytes)
    sequence.block_sizes.append(size)
    sequence.accepted.append(kept)
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


def run_alone(model, sequence: Sequence) -> Iterator[Tokens | Done]:
    scheduler = Scheduler(model)
    yield from scheduler.join(sequence)
    while scheduler.sequences:
        yield from scheduler.step()
