"""The rotary embedding's cos and sin at a pass's positions (layers/rope.py's tables, every layer's rotation reads
them).

`rope_angles` runs the Triton kernel of rope_angles_triton.py: one launch, where the torch reference
`rope_angles_torch` makes eight (the positions to float32, the angles, cos and sin, the attention factor twice, the
two casts), a decode step's every token; `rope_angles_op` picks one for a device.
"""

from collections.abc import Callable

import torch

from app.kernels.choice import kernel_or_reference


def rope_angles_torch(positions: torch.Tensor, inv_freq: torch.Tensor, factor: float,
                      dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """positions [T] int64, inv_freq [R/2] float32 -> cos, sin [T, R/2] in `dtype`, each times `factor`, computed in
    float32."""
    angles = positions.float()[:, None] * inv_freq
    return (angles.cos() * factor).to(dtype), (angles.sin() * factor).to(dtype)


def rope_angles(positions: torch.Tensor, inv_freq: torch.Tensor, factor: float,
                dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """`rope_angles_torch` in one Triton launch."""
    from app.kernels.rope_angles_triton import run_rope_angles  # Triton exists on Linux only

    return run_rope_angles(positions, inv_freq, factor, dtype)


def rope_angles_op(device: torch.device) -> Callable[..., tuple[torch.Tensor, torch.Tensor]]:
    return kernel_or_reference(device, rope_angles, rope_angles_torch)
