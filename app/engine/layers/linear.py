"""Linear layers whose weight is a tensor or an FP8 weight as stored: on a GPU dense FP8 weights stay FP8 (half
the bytes of bf16, app/kernels/fp8_linear.py); elsewhere they are dequantized at load.
"""

from collections.abc import Callable, Mapping
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from app.kernels.choice import triton_runs
from app.kernels.formats.fp8 import dequantize
from app.kernels.fp8_linear import epilogue_torch, fp8_linear_op, one_token_linear
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


def linear(
    x: torch.Tensor, weight: torch.Tensor | Fp8Weight, bias: torch.Tensor | None = None,
    glu: bool = False, residual: torch.Tensor | None = None,
) -> torch.Tensor:
    """x [..., in] @ weight [out, in].T (+ bias [out]) -> [..., out] in x's dtype; `glu` (gate rows then up rows:
    -> SiLU(gate) * up [..., out / 2]) and `residual` (added last) as fp8_linear's epilogues, which an FP8 weight
    runs in the product's launches, and an unscaled one at one token where Triton runs (`one_token_linear`, which
    also adds a bias that comes alone: one token's bias is an added row, as its residual is)."""
    if isinstance(weight, torch.Tensor):
        one_token = x.numel() == x.shape[-1] and triton_runs(x.device)
        if one_token and bias is None and (glu or residual is not None):
            return _in_one_launch(x, weight, glu, residual)
        if one_token and bias is not None and not glu and residual is None:
            return _in_one_launch(x, weight, False, bias)
        return epilogue_torch(F.linear(x, weight, bias), glu, residual)
    assert bias is None or not (glu or residual is not None), "a bias comes before the epilogues"
    flat = residual.reshape(-1, residual.shape[-1]) if residual is not None else None
    y = weight.multiply(x.reshape(-1, x.shape[-1]), weight.weight, weight.scale, weight.block, glu=glu,
                        residual=flat)
    y = y.reshape(*x.shape[:-1], y.shape[-1])
    return y if bias is None else y + bias


def _in_one_launch(x: torch.Tensor, weight: torch.Tensor, glu: bool, added: torch.Tensor | None) -> torch.Tensor:
    """One token x [..., in] times an unscaled weight with its epilogues (`added` [..., out] last) in one launch."""
    flat = added.reshape(1, -1) if added is not None else None
    return one_token_linear(x.reshape(1, -1), weight, glu, flat).reshape(*x.shape[:-1], -1)


def stacked_linear(
    x: torch.Tensor, stacked: torch.Tensor | Fp8Weight | None, parts: list | tuple | None
) -> torch.Tensor:
    """`linear` of the weights `stacked_rows` joined, or where it could not (`stacked` None) of each of `parts`,
    their outputs joined: [..., sum out_i] either way."""
    if stacked is not None:
        return linear(x, stacked)
    return torch.cat([linear(x, weight) for weight in parts], dim=-1)


def stacked_rows(weights: list[torch.Tensor | Fp8Weight]) -> torch.Tensor | Fp8Weight | None:
    """Linear weights [out_i, in] -> one [sum out_i, in] (one product for several: q, k and v; gate and up), or
    None where block scales would straddle two weights."""
    if all(isinstance(w, torch.Tensor) for w in weights):
        return torch.cat(weights)
    if not all(isinstance(w, Fp8Weight) for w in weights) or len({w.block for w in weights}) != 1:
        return None
    block = weights[0].block
    if block is not None and any(w.weight.shape[0] % block[0] for w in weights[:-1]):
        return None
    return Fp8Weight(torch.cat([w.weight for w in weights]), torch.cat([w.scale for w in weights]), block,
                     weights[0].multiply)
