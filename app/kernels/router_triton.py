"""The top-k softmax router of router.py in one Triton kernel: one program per token reads the router's
weights, keeps the logits in registers, picks the k largest one after another and weights them."""

import torch
import triton
import triton.language as tl

from app.kernels.dependent_launch import after_earlier_kernels, dependent_launch

ELEMENTS_PER_STEP = 32768  # weights read per loop step: few steps (3 at 32 experts), ~64 registers a thread at 16 warps


def run_top_k_router(
    x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor, k: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """x [T, H], weight [E, H], bias [E] -> (experts [T, k] int64, softmax weights [T, k] in x's dtype)."""
    (tokens, hidden), experts = x.shape, weight.shape[0]
    assert weight.shape[1] == hidden and bias.shape == (experts,) and k <= experts
    x, weight = x.contiguous(), weight.contiguous()
    picked = torch.empty((tokens, k), dtype=torch.int64, device=x.device)
    weights = torch.empty((tokens, k), dtype=x.dtype, device=x.device)
    block_e = triton.next_power_of_2(experts)
    block_h = min(triton.next_power_of_2(hidden), max(64, ELEMENTS_PER_STEP // block_e))
    _top_k_router_kernel[(tokens,)](
        x, weight, bias, picked, weights, hidden, experts,
        K=k, BLOCK_K=triton.next_power_of_2(k), BLOCK_E=block_e, BLOCK_H=block_h, num_warps=16,
        **dependent_launch(x.device),
    )
    return picked, weights


@triton.jit
def _top_k_router_kernel(
    x_ptr, weight_ptr, bias_ptr, picked_ptr, weights_ptr, hidden, experts,
    K: tl.constexpr, BLOCK_K: tl.constexpr, BLOCK_E: tl.constexpr, BLOCK_H: tl.constexpr, PDL: tl.constexpr,
):
    after_earlier_kernels(PDL)
    token = tl.program_id(0).to(tl.int64)
    expert = tl.arange(0, BLOCK_E)
    expert_ok = expert < experts
    acc = tl.zeros((BLOCK_E, BLOCK_H), tl.float32)
    for start in range(0, hidden, BLOCK_H):
        columns = start + tl.arange(0, BLOCK_H)
        inside = columns < hidden
        x = tl.load(x_ptr + token * hidden + columns, mask=inside, other=0.0).to(tl.float32)
        w = tl.load(weight_ptr + expert[:, None] * hidden + columns[None, :],
                    mask=expert_ok[:, None] & inside[None, :], other=0.0).to(tl.float32)
        acc += w * x[None, :]
    bias = tl.load(bias_ptr + expert, mask=expert_ok, other=0.0).to(tl.float32)
    # rounded to x's dtype, as the reference's product is, so that both pick among the same values
    logits = (tl.sum(acc, axis=1) + bias).to(weights_ptr.dtype.element_ty).to(tl.float32)
    logits = tl.where(expert_ok, logits, float("-inf"))
    slot = tl.arange(0, BLOCK_K)
    top = tl.full((BLOCK_K,), float("-inf"), tl.float32)
    for pick in tl.static_range(K):
        largest = tl.max(logits, axis=0)
        chosen = tl.min(tl.where(logits == largest, expert, BLOCK_E), axis=0)
        tl.store(picked_ptr + token * K + pick, chosen.to(tl.int64))
        top = tl.where(slot == pick, largest, top)
        logits = tl.where(expert == chosen, float("-inf"), logits)
    # the first pick is the largest: the softmax's shift
    exps = tl.exp(top - tl.max(top, axis=0))
    tl.store(weights_ptr + token * K + slot, (exps / tl.sum(exps, axis=0)).to(weights_ptr.dtype.element_ty),
             mask=slot < K)
