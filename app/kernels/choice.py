"""Which implementation of an op runs on a device."""

import os
from collections.abc import Callable

import torch


def kernel_or_reference(device: torch.device, kernel: Callable, reference: Callable) -> Callable:
    """The Triton kernel on CUDA; the torch reference elsewhere, unless TRITON_INTERPRET=1 asks for the
    kernel in Triton's interpreter."""
    if device.type == "cuda" or os.environ.get("TRITON_INTERPRET") == "1":
        return kernel
    return reference
