"""A device tensor copied to host memory in stream order now and read later: the read waits for the work queued
before the copy, not for what the host queued after it."""

import torch


class ReadLater:
    def __init__(self, value: torch.Tensor):
        on_gpu = value.device.type == "cuda"
        self._copy = torch.empty(value.shape, dtype=value.dtype, pin_memory=on_gpu).copy_(value, non_blocking=on_gpu)
        self._copied = torch.cuda.Event() if on_gpu else None
        if self._copied is not None:
            self._copied.record()

    def read(self) -> torch.Tensor:
        if self._copied is not None:
            self._copied.synchronize()
        return self._copy
