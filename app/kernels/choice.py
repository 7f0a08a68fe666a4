"""Which implementation of an op runs on a device."""

import os
from collections.abc import Callable

import torch


def triton_runs(device: torch.device) -> bool:
    """The Triton kernels run on CUDA, and on the CPU when TRITON_INTERPRET=1 asks for Triton's interpreter."""
    return device.type == "cuda" or os.environ.get("TRITON_INTERPRET") == "1"


def kernel_or_reference(device: torch.device, kernel: Callable, reference: Callable) -> Callable:
    """The Triton kernel where it runs (`triton_runs`), the torch reference elsewhere."""
    return kernel if triton_runs(device) else reference
