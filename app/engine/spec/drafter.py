"""What the speculative loop needs from a drafter (DFlash in `dflash.py`; tests and benchmarks bring
their own)."""

from dataclasses import dataclass, field
from typing import Protocol

import torch

from app.engine.sampling import Sampler


@dataclass(frozen=True)
class Proposal:
    """Draft tokens and, for drafts sampled from a distribution, that distribution [len(tokens), V];
    None means each draft is a deterministic choice (a one-hot proposal)."""

    tokens: list[int] = field(default_factory=list)
    probs: torch.Tensor | None = None


class Drafter(Protocol):
    block_size: int  # the most positions one step may verify: the anchor and block_size - 1 drafts
    target_layers: tuple[int, ...]  # target layers whose outputs `commit` receives

    def commit(self, features: torch.Tensor) -> None:
        """The next committed positions, in order: the captured target features [N, F] of each."""

    def propose(self, anchor: int, count: int, sampler: Sampler) -> Proposal:
        """`count` drafts to follow `anchor`, the token at the position after the committed ones."""
