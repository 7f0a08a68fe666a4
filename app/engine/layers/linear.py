"""Linear layers whose weight is a tensor or an FP8 weight as stored: on a GPU dense FP8 weights stay FP8 (half
the bytes of bf16, app/kernels/fp8_linear.py); elsewhere they are dequantized at load.
"""

from collections.abc import Callable, Mapping
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from app.kernels.formats.fp8 import dequantize
from app.kernels.fp8_linear import fp8_linear_op
from app.quantization import BLOCK_SCALE, PER_CHANNEL_SCALE


def keeps_fp8(device: torch.device) -> bool:
    """The planner counts such weights as stored there."""
    return device.type == "cuda"


@dataclass(frozen=True)
class Fp8Weight:
    weight: torch.Tensor  # [out, in] float8_e4m3fn
    scale: torch.Tensor  # [out, 1] per channel, or [ceil(out / b0), ceil(in / b1)] per block
    block: tuple[int, int] | None  # (b0, b1) for block scales
    multiply: Callable[..., torch.Tensor]  # fp8_linear or its torch reference, for the weight's device


def load_linear(
    stored: Mapping[str, torch.Tensor], block: tuple[int, int] | None, device: torch.device, dtype: torch.dtype
) -> torch.Tensor | Fp8Weight:
    """{"weight"} plus an FP8 scale as stored -> an Fp8Weight where `keeps_fp8(device)`, else a tensor in `dtype`."""
    on_device = {name: tensor.to(device) for name, tensor in stored.items()}
    if keeps_fp8(device) and PER_CHANNEL_SCALE in on_device:
        return Fp8Weight(on_device["weight"], on_device[PER_CHANNEL_SCALE], None, fp8_linear_op(device))
    if keeps_fp8(device) and BLOCK_SCALE in on_device:
        assert block is not None, "block scales need the checkpoint's weight_block_size"
        return Fp8Weight(on_device["weight"], on_device[BLOCK_SCALE], block, fp8_linear_op(device))
    return dequantize(on_device, block, dtype)


def linear(x: torch.Tensor, weight: torch.Tensor | Fp8Weight, bias: torch.Tensor | None = None) -> torch.Tensor:
    """x [..., in] @ weight [out, in].T (+ bias [out]) -> [..., out] in x's dtype."""
    if isinstance(weight, torch.Tensor):
        return F.linear(x, weight, bias)
    y = weight.multiply(x.reshape(-1, x.shape[-1]), weight.weight, weight.scale, weight.block)
    y = y.reshape(*x.shape[:-1], y.shape[-1])
    return y if bias is None else y + bias
