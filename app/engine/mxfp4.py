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

