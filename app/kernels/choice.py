"""Which implementation of an op runs on a device."""

import os
from collections.abc import Callable

import torch

from app.kernels.cpu import library as cpu_library


def triton_runs(device: torch.device) -> bool:
    """The Triton kernels run on CUDA, and on the CPU when TRITON_INTERPRET=1 asks for Triton's interpreter."""
    return device.type == "cuda" or os.environ.get("TRITON_INTERPRET") == "1"


def kernel_or_reference(device: torch.device, kernel: Callable, reference: Callable,
                        cpu_kernel: Callable | None = None) -> Callable:
    """The Triton kernel where it runs (`triton_runs`), else on the CPU the C kernel where there is one and it was
    built (cpu/library.py), else the torch reference."""
    if triton_runs(device):
        return kernel
    if device.type == "cpu" and cpu_kernel is not None and cpu_library.built():
        return cpu_kernel
    return reference
