"""A layer's routed-expert op as the expert cache calls it, in two forms: by cache slots, and (where the Triton
kernels run) by an address table that may point into page-locked host memory (expert_table.py)."""

import ctypes
from collections.abc import Callable
from dataclasses import dataclass

import torch

from app.kernels.pick_rows import PickRows


@dataclass(frozen=True)
class ExpertOp:
    """`by_slots(hidden [T, H], arenas, slots [T, k], weights [T, k]) -> [T, H]` reads the cache arenas' slots
    (-1: skip); `from_table(hidden, arenas, table, rows, weights)` reads where the table's rows point, None
    where only the torch reference runs; `capturable`: it needs no host work (a CUDA graph can hold it);
    `on_host(arenas)`, the C kernel's name and its structure over host arenas (cpu/library.py), for the CPU expert
    tier (None: these experts have no C kernel); `takes_shared(tokens, arenas)`, whether `by_slots` can add a shared
    expert's address row (expert_table.address_row) to those tokens' picks, as `shared=`;
    `takes_hidden_pairs(pairs, dtype, arenas)`, whether `by_slots` reads that many (token, pick) pairs' hidden states
    of `dtype` in float16 pairs (mxfp4_half_pairs.py), which it then takes as `hidden_pairs=` from the norm that made
    them (norms.add_rms_norm_half_pairs) instead of converting them in a launch of its own; given them, it returns
    its picks' rows unsummed (pick_rows.PickRows), which the next norm adds."""

    by_slots: Callable[..., torch.Tensor]
    from_table: Callable[..., torch.Tensor] | None
    capturable: bool
    on_host: Callable[[dict[str, torch.Tensor]], tuple[str, ctypes.Structure]] | None = None
    takes_shared: Callable[[int, dict[str, torch.Tensor]], bool] = lambda tokens, arenas: False
    takes_hidden_pairs: Callable[[int, torch.dtype, dict[str, torch.Tensor]], bool] = \
        lambda pairs, dtype, arenas: False

    def __call__(self, hidden, arenas, slots, weights, shared: torch.Tensor | None = None,
                 hidden_pairs: tuple[torch.Tensor, torch.Tensor] | None = None) -> torch.Tensor | PickRows:
        given = {name: value for name, value in (("shared", shared), ("hidden_pairs", hidden_pairs))
                 if value is not None}
        return self.by_slots(hidden, arenas, slots, weights, **given)
