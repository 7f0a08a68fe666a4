"""rope_angles.py's cos and sin in one Triton kernel: one program per position."""

import torch
import triton
import triton.language as tl

from app.kernels.dependent_launch import after_earlier_kernels, dependent_launch


def run_rope_angles(positions: torch.Tensor, inv_freq: torch.Tensor, factor: float,
                    dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """positions [T] int64, inv_freq [R/2] float32 -> cos, sin [T, R/2] in `dtype`, times `factor`."""
    assert positions.dim() == 1 and inv_freq.dim() == 1 and inv_freq.dtype == torch.float32
    tokens, half = len(positions), len(inv_freq)
    cos, sin = (torch.empty((tokens, half), dtype=dtype, device=positions.device) for _ in range(2))
    _rope_angles_kernel[(tokens,)](positions.contiguous(), inv_freq.contiguous(), cos, sin, factor, half,
                                   BLOCK=triton.next_power_of_2(half), num_warps=1, **dependent_launch(cos.device))
    return cos, sin


@triton.jit
def _rope_angles_kernel(positions_ptr, inv_freq_ptr, cos_ptr, sin_ptr, factor, half, BLOCK: tl.constexpr,
                        PDL: tl.constexpr):
    after_earlier_kernels(PDL)
    token = tl.program_id(0)
    columns = tl.arange(0, BLOCK)
    inside = columns < half
    # float32 as the reference computes them: the position rounded to float32, times each frequency
    angles = tl.load(positions_ptr + token).to(tl.float32) * tl.load(inv_freq_ptr + columns, mask=inside, other=0.0)
    at = token.to(tl.int64) * half + columns
    tl.store(cos_ptr + at, (tl.cos(angles) * factor).to(cos_ptr.dtype.element_ty), mask=inside)
    tl.store(sin_ptr + at, (tl.sin(angles) * factor).to(sin_ptr.dtype.element_ty), mask=inside)
