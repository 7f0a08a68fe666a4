"""MXFP4 as GPT-OSS checkpoints store it.

Blocks are uint8 [..., G, 16]: each byte holds two e2m1 codes, low nibble first (element 2j in the
low nibble, 2j+1 in the high one); scales are uint8 [..., G] and mean 2^(s - 127) for the 32 values
of their group.
"""

import torch

E2M1_VALUES = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0)


def decode_mxfp4(blocks: torch.Tensor, scales: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """blocks [..., G, 16] uint8, scales [..., G] uint8 -> values [..., G * 32] in `dtype`."""
    table = torch.tensor(E2M1_VALUES, dtype=dtype, device=blocks.device)
    codes = torch.stack((blocks & 0x0F, blocks >> 4), dim=-1).long()  # [..., G, 16, 2]
    values = table[codes].flatten(-2)  # [..., G, 32]
    exponents = scales.to(torch.int32) - 127
    values = torch.ldexp(values, exponents.unsqueeze(-1).to(dtype))
    return values.flatten(-2)



# Rounding boundaries between neighbouring e2m1 magnitudes 0, .5, 1, 1.5, 2, 3, 4, 6.
_E2M1_MIDPOINTS = (0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0)


def encode_mxfp4(values: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """values [..., G * 32] -> (blocks [..., G, 16] uint8, scales [..., G] uint8), the inverse of
    `decode_mxfp4` up to rounding: each group's scale is the smallest power of two that brings its
    largest magnitude within 6 (so nothing clips), and each value rounds to the nearest e2m1 code."""
    groups = values.float().contiguous().unflatten(-1, (-1, 32))  # [..., G, 32]
    largest = groups.abs().amax(dim=-1).clamp(min=2.0**-126)
    exponents = torch.ceil(torch.log2(largest / 6.0)).clamp(-127, 127)  # [..., G]
    scaled = groups / torch.exp2(exponents).unsqueeze(-1)
    midpoints = torch.tensor(_E2M1_MIDPOINTS, device=values.device)
    magnitudes = torch.bucketize(scaled.abs(), midpoints).to(torch.uint8)  # codes 0 … 7
    codes = torch.where((scaled < 0) & (magnitudes > 0), magnitudes + 8, magnitudes)
    pairs = codes.unflatten(-1, (16, 2))
    blocks = pairs[..., 0] | (pairs[..., 1] << 4)
    return blocks, (exponents + 127).to(torch.uint8)
