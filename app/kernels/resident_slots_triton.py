"""The slot lookup and use count of resident_slots.py in one Triton program."""

import torch
import triton
import triton.language as tl

from app.kernels.dependent_launch import after_earlier_kernels, dependent_launch


def run_resident_slots(slot_row: torch.Tensor, experts: torch.Tensor, uses: torch.Tensor) -> torch.Tensor:
    """slot_row [E + 1], experts [1, k] -> slots [1, k]; uses [] += the picks with a slot."""
    assert experts.shape[0] == 1 and slot_row.dim() == 1 and slot_row.is_contiguous() and uses.numel() == 1
    experts = experts.contiguous()
    slots = torch.empty_like(experts)
    picks = experts.shape[1]
    _resident_slots_kernel[(1,)](slot_row, experts, uses, slots, slot_row.shape[0], picks,
                                 BLOCK=triton.next_power_of_2(picks), num_warps=1, **dependent_launch(slot_row.device))
    return slots


@triton.jit
def _resident_slots_kernel(slot_row_ptr, experts_ptr, uses_ptr, slots_ptr, row_length, picks, BLOCK: tl.constexpr,
                           PDL: tl.constexpr):
    after_earlier_kernels(PDL)
    look_up_slots(slot_row_ptr, experts_ptr, uses_ptr, slots_ptr, row_length, picks, BLOCK)


@triton.jit
def look_up_slots(slot_row_ptr, experts_ptr, uses_ptr, slots_ptr, row_length, picks, BLOCK: tl.constexpr):
    """slots[p] = slot_row[experts[p]] for one token's picks; uses grows by those with a slot (also run by the
    sigmoid router's choosing program, sigmoid_router_triton.py)."""
    pick = tl.arange(0, BLOCK)
    taken = pick < picks
    expert = tl.load(experts_ptr + pick, mask=taken, other=0)
    expert = tl.where(expert < 0, row_length + expert, expert)  # -1 is the last entry, as torch indexes
    slot = tl.load(slot_row_ptr + expert, mask=taken, other=-1)
    tl.store(slots_ptr + pick, slot, mask=taken)
    tl.store(uses_ptr, tl.load(uses_ptr) + tl.sum((slot >= 0).to(tl.int64), axis=0))
