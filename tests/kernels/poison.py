"""Allocations that start as NaN (integers: a huge negative number), so that a kernel which reads
or returns memory it never wrote shows it instead of passing on leftovers of an earlier run."""

import math
from contextlib import contextmanager

import torch


@contextmanager
def poisoned_allocations():
    empty, empty_like = torch.empty, torch.empty_like

    def poison(tensor: torch.Tensor) -> torch.Tensor:
        return tensor.fill_(math.nan if tensor.is_floating_point() else -(2**30))

    torch.empty = lambda *args, **kwargs: poison(empty(*args, **kwargs))
    torch.empty_like = lambda *args, **kwargs: poison(empty_like(*args, **kwargs))
    try:
        yield
    finally:
        torch.empty, torch.empty_like = empty, empty_like
