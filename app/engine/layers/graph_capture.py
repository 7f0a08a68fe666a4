"""What every CUDA graph capture of the engine does first: warm up on one side stream per device."""

import functools
from collections.abc import Callable

import torch

from app.engine.layers.kv_cache import KVCache


@functools.cache
def side_stream(device: torch.device) -> torch.cuda.Stream:
    """The one stream on which every capture of this process warms up. Each stream that runs a matrix
    product gets its own cuBLAS workspace (32 MiB on Hopper) that lives as long as the process: a new
    stream per capture left ~33 MB behind each time, past the GPU budget after a few generations."""
    return torch.cuda.Stream(device)


def warm_up(run: Callable[[], object], device: torch.device, cache: KVCache | None = None) -> None:
    """Run what is to be captured twice on the side stream (kernels compile, libraries allocate their
    workspaces outside the capture). A pass over `cache` is rewound to its committed rows after each run:
    rows past them are not part of the context yet, so warm-up and capture may write them."""
    committed = cache.length if cache is not None else 0
    side = side_stream(device)
    side.wait_stream(torch.cuda.current_stream(device))
    with torch.cuda.stream(side):
        for _ in range(2):
            run()
            if cache is not None:
                cache.truncate(committed)
    torch.cuda.current_stream(device).wait_stream(side)
