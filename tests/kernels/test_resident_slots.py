"""The resident slot lookup kernel against its torch reference, in Triton's interpreter (see conftest.py)."""

import torch

from app.kernels.resident_slots import resident_slots, resident_slots_torch


def test_resident_slots_match_reference():
    slot_row = torch.tensor([3, -1, 0, 7, 2, 5, -1])  # 6 experts and another device's -1 entry
    for experts in ([[4, 0, 2, 3]], [[1, -1, 5, 0]], [[-1, -1, 2]]):
        experts = torch.tensor(experts)
        uses, want_uses = torch.tensor(10), torch.tensor(10)
        slots = resident_slots(slot_row, experts, uses)
        assert torch.equal(slots, resident_slots_torch(slot_row, experts, want_uses))
        assert uses == want_uses
