"""A layer's routed experts before their picks are summed, for the norm after them to add.

The one-token MXFP4 experts (gpt_oss_experts_half_pairs.py) end in one float32 row per (token, pick); a launch of
its own (`expert_tiles.sum_picks`) added a token's rows, and the next layer's add + RMSNorm then read that sum. Where
the op also takes its inputs from the norm before it (`hidden_pairs`), it hands over the rows instead and the norm
after adds them itself, in the same order (norms_triton.py): one launch fewer a layer, the same bits.
"""

from typing import NamedTuple

import torch


class PickRows(NamedTuple):
    """rows [T * k, H] float32, each pick's expert output times its routing weight; slots [T, k], -1 where the
    pick was skipped (its row never written)."""

    rows: torch.Tensor
    slots: torch.Tensor

    def total(self, dtype: torch.dtype) -> torch.Tensor:
        """Each token's rows summed in pick order -> [T, H] in `dtype` (`sum_picks`; Triton, as the op that made
        them)."""
        from app.kernels.expert_tiles import sum_picks  # Triton exists on Linux only

        return sum_picks(self.rows, self.slots, dtype)
