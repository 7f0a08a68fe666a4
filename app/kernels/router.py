"""A top-k softmax router (GPT-OSS's): logits = x W^T + b, the k largest, softmax over those k.

`top_k_router` runs the Triton kernel of router_triton.py (product, top-k and softmax in one launch);
`top_k_router_torch` is the reference with the same signature; `top_k_router_op` picks one for a device.
"""

from collections.abc import Callable

import torch

from app.kernels.choice import kernel_or_reference


def top_k_router_torch(
    x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor, k: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """x [T, H], weight [E, H], bias [E] -> (experts [T, k] int64, largest logit first; their softmax weights
    [T, k] in x's dtype)."""
    top = torch.topk(torch.addmm(bias, x, weight.T), k, dim=-1)
    return top.indices, torch.softmax(top.values, dim=-1)


def top_k_router(
    x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor, k: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """`top_k_router_torch` in one Triton launch (ties go to the lower expert)."""
    from app.kernels.router_triton import run_top_k_router  # Triton exists on Linux only

    return run_top_k_router(x, weight, bias, k)


def top_k_router_op(device: torch.device) -> Callable[..., tuple[torch.Tensor, torch.Tensor]]:
    return kernel_or_reference(device, top_k_router, top_k_router_torch)
