"""The sigmoid router of GLM and DeepSeek ("noaux_tc"): float32 scores sigmoid(x W^T); a correction bias added
for choosing only; with groups, only the `topk_group` groups of the largest top-two sums compete; the k largest
chosen; their unbiased scores, normalised to sum 1 where `normalize`, times `scale`.

`sigmoid_router` runs the Triton kernels of sigmoid_router_triton.py (at decode the product and the choice in one
launch; longer passes cuBLAS's product, then the choice); `sigmoid_router_torch` is the reference, which also
weights experts chosen for it (`chosen`, for benchmarks' routing overrides); `sigmoid_router_op` picks one for a
device. Where every expert is resident, one token's routing also looks up its picks' slots in the expert cache
(`sigmoid_router_slots`: the same launch), which would otherwise take a launch of resident_slots.py's.
"""

from collections.abc import Callable
from dataclasses import dataclass

import torch

from app.kernels.choice import kernel_or_reference
from app.kernels.resident_slots import resident_slots_torch


@dataclass(frozen=True)
class SigmoidRouting:
    """A config's routing constants."""

    k: int
    groups: int = 1  # n_group
    kept_groups: int = 1  # topk_group
    normalize: bool = True  # norm_topk_prob
    scale: float = 1.0  # routed_scaling_factor


def sigmoid_router_torch(
    x: torch.Tensor, weight: torch.Tensor, correction_bias: torch.Tensor, routing: SigmoidRouting,
    chosen: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """x [T, H], weight [E, H] float32, correction_bias [E] float32 -> (experts [T, k] int64, weights [T, k] in
    x's dtype); given `chosen` [T, k], only weights those."""
    scores = torch.sigmoid(x.float() @ weight.T)
    if chosen is None:
        choice = scores + correction_bias
        if routing.groups > 1:
            per_group = choice.unflatten(-1, (routing.groups, -1))  # [T, G, E / G]
            group_scores = per_group.topk(2, dim=-1).values.sum(dim=-1)
            kept = torch.zeros_like(group_scores, dtype=torch.bool)
            kept.scatter_(1, group_scores.topk(routing.kept_groups, dim=-1).indices, True)
            choice = per_group.masked_fill(~kept[..., None], float("-inf")).flatten(-2)
        chosen = choice.topk(routing.k, dim=-1).indices
    weights = scores.gather(1, chosen)
    if routing.normalize:
        weights = weights / (weights.sum(dim=-1, keepdim=True) + 1e-20)
    return chosen, (weights * routing.scale).to(x.dtype)


def sigmoid_router(
    x: torch.Tensor, weight: torch.Tensor, correction_bias: torch.Tensor, routing: SigmoidRouting,
) -> tuple[torch.Tensor, torch.Tensor]:
    """`sigmoid_router_torch` in Triton: one launch at decode; longer passes cuBLAS's product, then the choice's
    launch (ties go to the lower expert)."""
    from app.kernels.sigmoid_router_triton import run_sigmoid_router  # Triton exists on Linux only

    return run_sigmoid_router(x, weight, correction_bias, routing)[:2]


def sigmoid_router_op(device: torch.device) -> Callable[..., tuple[torch.Tensor, torch.Tensor]]:
    return kernel_or_reference(device, sigmoid_router, sigmoid_router_torch)


def sigmoid_router_slots_torch(
    x: torch.Tensor, weight: torch.Tensor, correction_bias: torch.Tensor, routing: SigmoidRouting,
    slot_row: torch.Tensor, uses: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """One token x [1, H]: `sigmoid_router_torch`'s (experts, weights), and the experts' slots [1, k] where every
    expert is resident (`resident_slots_torch` of slot_row [E + 1]; `uses` grows by the picks with a slot)."""
    experts, weights = sigmoid_router_torch(x, weight, correction_bias, routing)
    return experts, weights, resident_slots_torch(slot_row, experts, uses)


def sigmoid_router_slots(
    x: torch.Tensor, weight: torch.Tensor, correction_bias: torch.Tensor, routing: SigmoidRouting,
    slot_row: torch.Tensor, uses: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """`sigmoid_router_slots_torch` in one Triton launch: the choosing program looks the slots up."""
    from app.kernels.sigmoid_router_triton import run_sigmoid_router  # Triton exists on Linux only

    return run_sigmoid_router(x, weight, correction_bias, routing, slot_row, uses)


def sigmoid_router_slots_op(device: torch.device) -> Callable[..., tuple[torch.Tensor, torch.Tensor, torch.Tensor]]:
    return kernel_or_reference(device, sigmoid_router_slots, sigmoid_router_slots_torch)
