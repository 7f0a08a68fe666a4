"""What every CUDA graph capture of the engine does first: warm up on one side stream per device."""

import functools
from collections.abc import Callable

import torch

from app.engine.layers.kv_cache import KVCache


@functools.cache
def side_stream(device: torch.device) -> torch.cuda.Stream:
    """One per process: each stream running a matmul keeps its own cuBLAS workspace (32 MiB on Hopper) for good,
    so a stream per capture leaked past the GPU budget after a few generations."""
    return torch.cuda.Stream(device)


def warm_up(run: Callable[[], object], device: torch.device, cache: KVCache | None = None) -> None:
    """Twice, so kernels compile and libraries allocate outside the capture; `cache` is rewound to its committed
    rows after each run."""
    committed = cache.length if cache is not None else 0
    side = side_stream(device)
    side.wait_stream(torch.cuda.current_stream(device))
    with torch.cuda.stream(side):
        for _ in range(2):
            run()
            if cache is not None:
                cache.truncate(committed)
    torch.cuda.current_stream(device).wait_stream(side)
