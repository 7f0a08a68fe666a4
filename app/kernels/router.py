"""A top-k softmax router (GPT-OSS's): logits = x W^T + b, the k largest, softmax over those k.

`top_k_router` runs the Triton kernel of router_triton.py (product, top-k and softmax in one launch);
`top_k_router_torch` is the reference with the same signature; `top_k_router_op` picks one for a device. Where every
expert is resident, one token's launch can also look the picks' cache slots up (`top_k_router_slots`), which would
otherwise take a launch of resident_slots.py's.
"""

from collections.abc import Callable

import torch

from app.kernels.choice import kernel_or_reference
from app.kernels.resident_slots import resident_slots_torch


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

    return run_top_k_router(x, weight, bias, k)[:2]


def top_k_router_op(device: torch.device) -> Callable[..., tuple[torch.Tensor, torch.Tensor]]:
    return kernel_or_reference(device, top_k_router, top_k_router_torch)


def top_k_router_slots_torch(
    x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor, k: int, slot_row: torch.Tensor, uses: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """One token x [1, H]: `top_k_router_torch`'s (experts, weights), and the experts' slots [1, k] where every expert
    is resident (`resident_slots_torch` of slot_row [E + 1]; `uses` grows by the picks with a slot)."""
    experts, weights = top_k_router_torch(x, weight, bias, k)
    return experts, weights, resident_slots_torch(slot_row, experts, uses)


def top_k_router_slots(
    x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor, k: int, slot_row: torch.Tensor, uses: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """`top_k_router_slots_torch` in one Triton launch: the choosing program looks the slots up."""
    from app.kernels.router_triton import run_top_k_router  # Triton exists on Linux only

    return run_top_k_router(x, weight, bias, k, slot_row, uses)


def top_k_router_slots_op(device: torch.device) -> Callable[..., tuple[torch.Tensor, torch.Tensor, torch.Tensor]]:
    return kernel_or_reference(device, top_k_router_slots, top_k_router_slots_torch)
