"""A lone sequence's plain passes run one ahead of the host: the pass from token k + 1 is queued before the host
reads token k, so while the host reads a token, emits it and queues the next pass, the device runs the one before.
Without this the device waits each step for the token's read, the events and the next pass's launch. A speculative
sequence's plain steps run so while its policy holds them (`BlockSizer.holds_plain`).

Only over a complete expert cache (`StepRunner.runs_ahead`): its counts live on the device alone, so the snapshot
after a pass can be taken in stream order and read later, as its token is.
"""

import time
from collections.abc import Callable

import torch

from app.engine.generation.sampling import Sampler
from app.engine.layers.read_later import ReadLater
from app.engine.runner.step_runner import StepRunner
from app.protocol.stats import CacheStats


class AheadPass:
    """One pass committed from `tokens` [1] on the device, and the token sampled from its logits, kept on the
    device for the next pass while a copy travels to the host. With `capture`, `features` [1, F] for a drafter."""

    def __init__(self, runner: StepRunner, sampler: Sampler, tokens: torch.Tensor, capture: tuple[int, ...] = ()):
        self.queued_at = time.perf_counter()
        logits, features = runner.run_on_device(tokens, capture)
        # copied out in stream order: the next pass, queued before this one is read, overwrites the graph's
        self.features = features.clone() if capture else None
        self.token = sampler.sample_on_device(logits[-1:])  # [1]
        self._token = ReadLater(self.token)
        self._stats: Callable[[], CacheStats] = runner.model.experts.snapshot_later()

    def read(self) -> tuple[int, CacheStats]:
        """-> the sampled token and the expert cache's counts after the pass (waits for this pass alone)."""
        return int(self._token.read()[0]), self._stats()
