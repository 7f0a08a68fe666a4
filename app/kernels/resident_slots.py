"""The slots of one token's picked experts when every expert is resident, with their count of uses: what the
expert cache does before each MoE layer of a fully resident decode step.

`resident_slots` is the Triton kernel of resident_slots_triton.py (one launch for the lookup and the count);
`resident_slots_torch` is the reference with the same signature; `resident_slots_op` picks one for a device.
"""

from collections.abc import Callable

import torch

from app.kernels.choice import kernel_or_reference


def resident_slots_torch(slot_row: torch.Tensor, experts: torch.Tensor, uses: torch.Tensor) -> torch.Tensor:
    """slot_row [E + 1] int64 (-1: no slot; expert -1, another device's pick, indexes the last entry), experts
    [1, k] (distinct) -> their slots [1, k]; `uses` [] int64 grows by the picks that have a slot."""
    slots = slot_row[experts]
    uses += (slots >= 0).sum()
    return slots


def resident_slots(slot_row: torch.Tensor, experts: torch.Tensor, uses: torch.Tensor) -> torch.Tensor:
    """`resident_slots_torch` in one Triton launch."""
    from app.kernels.resident_slots_triton import run_resident_slots  # Triton exists on Linux only

    return run_resident_slots(slot_row, experts, uses)


def resident_slots_op(device: torch.device) -> Callable[..., torch.Tensor]:
    return kernel_or_reference(device, resident_slots, resident_slots_torch)
