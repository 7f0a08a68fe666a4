"""Continuous batching: the engine process's generations as sequences of one scheduler (scheduler.py), admitted
while their KV caches fit the planned context."""

from app.engine.generation.sampling import Sampler, SamplingParams
from app.engine.generation.scheduler import Scheduler, Sequence
from app.engine.runner.step_runner import RunnerPool
from app.protocol.events import Done, Tokens
from app.protocol.stats import GenerationStats


class Batch:
    """At most `max_sequences` at once, their KV caches within the planned context; with one at most, every
    generation runs over the session's own cache and keeps its captured passes. Calls return their events, as
    the scheduler's do."""

    def __init__(self, session, max_sequences: int):
        self.session = session
        self.model = session.loaded.model
        self.context = session.loaded.context
        self.speculation = session.speculation
        self.stop_ids = session.loaded.folder.stop_token_ids()
        self.max_sequences = max_sequences
        self.scheduler = Scheduler(self.model, batch_stats=True)
        self.runners = RunnerPool(self.model, self.context, session.runner if max_sequences == 1 else None)
        self._held: dict[int, Sequence] = {}  # every joined sequence until its runner and drafter are back

    @property
    def sequences(self) -> dict[int, Sequence]:
        return self.scheduler.sequences

    def cache_tokens(self, prompt_tokens: int, max_new_tokens: int) -> int:
        return min(prompt_tokens + max_new_tokens, self.context)

    def has_room(self, cache_tokens: int) -> bool:
        return len(self.sequences) < self.max_sequences and self.runners.fits(cache_tokens)

    def join(self, request_id: int, prompt_ids: list[int], sampling: SamplingParams,
             max_new_tokens: int) -> list[Tokens | Done]:
        capacity = self.cache_tokens(len(prompt_ids), max_new_tokens)
        assert self.has_room(capacity), "no room in the batch: ask has_room first"
        runner = self.runners.take(capacity)
        speculation = self.speculation
        sequence = Sequence(
            request_id, prompt_ids, runner, Sampler(sampling, self.model.device), max_new_tokens, self.stop_ids,
            answer=self.session.answer_events(request_id, prompt_ids),
            drafter=speculation.new_drafter(runner.cache.capacity) if speculation else None,
            block_size=speculation.block_size if speculation else None,
        )
        self._held[request_id] = sequence
        try:
            return self._releasing(self.scheduler.join(sequence))
        except BaseException:
            self._release(request_id)
            raise

    def step(self) -> list[Tokens | Done]:
        return self._releasing(self.scheduler.step())

    def leave(self, request_id: int) -> GenerationStats | None:
        """-> Done's stats of what it did, None if it is not decoding here."""
        stats = self.scheduler.leave(request_id)
        if stats is not None:
            self._release(request_id)
        return stats

    def _releasing(self, events: list[Tokens | Done]) -> list[Tokens | Done]:
        for event in events:
            if isinstance(event, Done):
                self._release(event.request_id)
        return events

    def _release(self, request_id: int) -> None:
        sequence = self._held.pop(request_id)
        self.runners.give_back(sequence.runner)
        if sequence.drafter is not None:
            self.speculation.release(sequence.drafter)
