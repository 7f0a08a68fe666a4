"""FP8 (e4m3) weights and their scales, dequantized in float32 (see app/quantization.py for the formats)."""

from collections.abc import Mapping

import torch

from app.quantization import BLOCK_SCALE, PER_CHANNEL_SCALE


def dequantize_per_channel(weight: torch.Tensor, scale: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """weight [..., out, in] float8, scale [..., out, 1] -> [..., out, in] in `dtype`."""
    return (weight.float() * scale.float()).to(dtype)


def dequantize_blocks(
    weight: torch.Tensor, scale_inv: torch.Tensor, block: tuple[int, int], dtype: torch.dtype
) -> torch.Tensor:
    """weight [..., out, in] float8, scale_inv [..., ceil(out/b0), ceil(in/b1)] -> [..., out, in] in `dtype`.

    The last row and column of blocks may be partial: their scales cover only the rows/columns that exist.
    """
    rows, cols = weight.shape[-2:]
    scale = scale_inv.float().repeat_interleave(block[0], dim=-2)[..., :rows, :]
    scale = scale.repeat_interleave(block[1], dim=-1)[..., :cols]
    return (weight.float() * scale).to(dtype)


def dequantize(stored: Mapping[str, torch.Tensor], block: tuple[int, int] | None, dtype: torch.dtype) -> torch.Tensor:
    """A weight as its checkpoint stores it — {"weight"} plus {"weight_scale"} or {"weight_scale_inv"} when it
    is FP8 — in `dtype`."""
    weight = stored["weight"]
    if PER_CHANNEL_SCALE in stored:
        return dequantize_per_channel(weight, stored[PER_CHANNEL_SCALE], dtype)
    if BLOCK_SCALE in stored:
        assert block is not None, "block scales need the checkpoint's weight_block_size"
        return dequantize_blocks(weight, stored[BLOCK_SCALE], block, dtype)
    return weight.to(dtype)
