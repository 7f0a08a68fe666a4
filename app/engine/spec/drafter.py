"""What the speculative loop needs from a drafter (DFlash in `dflash.py`, GLM's MTP layer in `mtp.py`;
tests and benchmarks bring their own) and from a way to speculate set up next to a target."""

from dataclasses import dataclass, field
from typing import Protocol

import torch

from app.engine.generation.sampling import Sampler


@dataclass(frozen=True)
class Proposal:
    """`probs` [len(tokens), V] for sampled drafts; None: deterministic (one-hot) drafts."""

    tokens: list[int] = field(default_factory=list)
    probs: torch.Tensor | None = None


class Drafter(Protocol):
    """One generation's drafter."""

    block_size: int  # the most positions one step may verify: the anchor and block_size - 1 drafts
    target_layers: tuple[int, ...]  # target layers whose outputs `commit` receives

    def commit(self, token_ids: list[int], features: torch.Tensor) -> None:
        """The next committed positions: tokens [N], target features [N, F]."""

    def propose(self, anchor: int, count: int, sampler: Sampler) -> Proposal:
        """`anchor`: the token at the position after the committed ones."""


class Speculation(Protocol):
    """`budget_left` before the target loads, `load` after, then one drafter per generation. `block_size`: forced,
    None for the cost-aware policy."""

    block_size: int | None

    def budget_left(self, gpu_budget: int | None, context: int, dtype: str) -> int | None: ...

    def load(self, model) -> None: ...

    def new_drafter(self, capacity: int) -> Drafter: ...

    def release(self, drafter: Drafter) -> None:
        """The generation `drafter` served has ended."""
