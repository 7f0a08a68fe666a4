"""The residual add and RMSNorm of norms.py in one Triton kernel: one program per token."""

import torch
import triton
import triton.language as tl

from app.kernels.dependent_launch import after_earlier_kernels, dependent_launch


def run_add_rms_norm(
    x: torch.Tensor, delta: torch.Tensor, weight: torch.Tensor, eps: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """x, delta [T, H], weight [H] -> (x + delta, its RMSNorm), both in x's dtype."""
    assert x.shape == delta.shape and x.dim() == 2 and weight.shape == (x.shape[1],)
    x, delta = x.contiguous(), delta.contiguous()
    total, normed = torch.empty_like(x), torch.empty_like(x)
    hidden = x.shape[1]
    _add_rms_norm_kernel[(x.shape[0],)](
        x, delta, weight, total, normed, hidden, eps, BLOCK=triton.next_power_of_2(hidden), num_warps=8,
        **dependent_launch(x.device),
    )
    return total, normed


@triton.jit
def _add_rms_norm_kernel(x_ptr, delta_ptr, weight_ptr, total_ptr, normed_ptr, hidden, eps, BLOCK: tl.constexpr,
                         PDL: tl.constexpr):
    after_earlier_kernels(PDL)
    columns = tl.arange(0, BLOCK)
    inside = columns < hidden
    row = tl.program_id(0).to(tl.int64) * hidden
    x = tl.load(x_ptr + row + columns, mask=inside, other=0.0)
    delta = tl.load(delta_ptr + row + columns, mask=inside, other=0.0)
    # rounded to x's dtype, as the reference's add is: the norm reads what is stored
    total = (x.to(tl.float32) + delta.to(tl.float32)).to(total_ptr.dtype.element_ty)
    tl.store(total_ptr + row + columns, total, mask=inside)
    total = total.to(tl.float32)
    scale = tl.rsqrt(tl.sum(total * total, axis=0) / hidden + eps)
    weight = tl.load(weight_ptr + columns, mask=inside, other=0.0).to(tl.float32)
    tl.store(normed_ptr + row + columns, (total * scale * weight).to(normed_ptr.dtype.element_ty), mask=inside)
