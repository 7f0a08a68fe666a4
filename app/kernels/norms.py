"""RMSNorm, alone or after a residual add, as a decoder layer runs it between its attention and its MLP.

`add_rms_norm` runs the Triton kernel of norms_triton.py (one launch for the add, the sum of squares and the
scaled output; given nothing to add, the norm alone: one launch where `rms_norm` makes torch's three);
`add_rms_norm_torch` is the reference with the same signature; `add_rms_norm_op` picks one for a device.
`add_rms_norm_half_pairs` also gives the norm as the MXFP4 one-token experts read it.
"""

from collections.abc import Callable

import torch
import torch.nn.functional as F

from app.kernels.choice import kernel_or_reference
from app.kernels.pick_rows import PickRows


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """Normalise in float32, scale, return in x's dtype (one fused kernel where torch has one)."""
    return F.rms_norm(x.float(), weight.shape, weight.float(), eps).to(x.dtype)


def add_rms_norm_torch(
    x: torch.Tensor, delta: torch.Tensor | PickRows | None, weight: torch.Tensor, eps: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """x, delta [T, H] -> (x + delta, rms_norm(x + delta)), both in x's dtype; no delta: (x, rms_norm(x)); delta
    as an expert op's picks before their sum (pick_rows.py): that sum in x's dtype is the delta."""
    if isinstance(delta, PickRows):
        delta = delta.total(x.dtype)
    total = x if delta is None else x + delta
    return total, rms_norm(total, weight, eps)


def add_rms_norm(
    x: torch.Tensor, delta: torch.Tensor | PickRows | None, weight: torch.Tensor, eps: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """`add_rms_norm_torch` in one Triton launch."""
    from app.kernels.norms_triton import run_add_rms_norm  # Triton exists on Linux only

    return run_add_rms_norm(x, delta, weight, eps)


def add_rms_norm_half_pairs(
    x: torch.Tensor, delta: torch.Tensor, weight: torch.Tensor, eps: float
) -> tuple[torch.Tensor, torch.Tensor, tuple[torch.Tensor, torch.Tensor]]:
    """`add_rms_norm`, and its norm as the MXFP4 one-token experts take their inputs (`half_pairs` of
    mxfp4_half_pairs.py), from the same launch; Triton only."""
    from app.kernels.norms_triton import run_add_rms_norm

    return run_add_rms_norm(x, delta, weight, eps, half_pairs=True)


def add_rms_norm_op(device: torch.device) -> Callable[..., tuple[torch.Tensor, torch.Tensor]]:
    return kernel_or_reference(device, add_rms_norm, add_rms_norm_torch)
