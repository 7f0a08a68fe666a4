"""The sigmoid router of sigmoid_router.py in two Triton kernels. The product: at decode (up to DECODE_TOKENS
tokens) programs over (block of experts, share of the inputs) each read their piece of the float32 weight once
and write partial sums for every token (GLM-4.5-Air's 2 MB router in 128 programs; one program per token
would read it through one SM); longer passes take cuBLAS's product as one share. The choice: one program per
token on one warp (its many small reductions stay within the warp) sums the shares and picks, in float32, with
the experts laid out as [groups, experts per group]."""

import torch
import triton
import triton.language as tl

from app.kernels.sigmoid_router import SigmoidRouting

DECODE_TOKENS = 16
BLOCK_E = 16  # experts per product program
BLOCK_H = 256  # inputs per product program


def run_sigmoid_router(
    x: torch.Tensor, weight: torch.Tensor, correction_bias: torch.Tensor, routing: SigmoidRouting,
) -> tuple[torch.Tensor, torch.Tensor]:
    """x [T, H], weight [E, H] float32, correction_bias [E] float32 -> (experts [T, k] int64, weights [T, k])."""
    (tokens, hidden), experts = x.shape, weight.shape[0]
    per_group = experts // routing.groups
    assert weight.shape[1] == hidden and correction_bias.shape == (experts,) and routing.k <= experts
    assert experts % routing.groups == 0 and (routing.groups == 1 or per_group >= 2)
    x = x.contiguous()
    if tokens > DECODE_TOKENS:
        shares = (x.float() @ weight.T)[None]
    else:
        shares = torch.empty((triton.cdiv(hidden, BLOCK_H), tokens, experts), dtype=torch.float32, device=x.device)
        _product_kernel[(triton.cdiv(experts, BLOCK_E), shares.shape[0])](
            x, weight.contiguous(), shares, tokens, hidden, experts, BLOCK_E=BLOCK_E, BLOCK_H=BLOCK_H, num_warps=4,
        )
    picked = torch.empty((tokens, routing.k), dtype=torch.int64, device=x.device)
    weights = torch.empty((tokens, routing.k), dtype=x.dtype, device=x.device)
    _choice_kernel[(tokens,)](
        shares, correction_bias.contiguous(), picked, weights, tokens, shares.shape[0], routing.scale,
        K=routing.k, BLOCK_K=triton.next_power_of_2(routing.k), GROUPS=routing.groups,
        BLOCK_GROUPS=triton.next_power_of_2(routing.groups), KEPT_GROUPS=routing.kept_groups, PER_GROUP=per_group,
        BLOCK_PER_GROUP=triton.next_power_of_2(per_group), NORMALIZE=routing.normalize, num_warps=1,
    )
    return picked, weights


@triton.jit
def _product_kernel(x_ptr, weight_ptr, shares_ptr, tokens, hidden, experts,
                    BLOCK_E: tl.constexpr, BLOCK_H: tl.constexpr):
    """shares[share, t, e] = sum over the share's inputs of x[t] * W[e], for the program's experts."""
    expert = tl.program_id(0) * BLOCK_E + tl.arange(0, BLOCK_E)
    share = tl.program_id(1)
    columns = share * BLOCK_H + tl.arange(0, BLOCK_H)
    inside = columns < hidden
    w = tl.load(weight_ptr + expert[:, None].to(tl.int64) * hidden + columns[None, :],
                mask=(expert < experts)[:, None] & inside[None, :], other=0.0)
    for token in range(tokens):
        x = tl.load(x_ptr + token * hidden + columns, mask=inside, other=0.0).to(tl.float32)
        tl.store(shares_ptr + (share * tokens + token) * experts + expert, tl.sum(w * x[None, :], axis=1),
                 mask=expert < experts)


@triton.jit
def _choice_kernel(shares_ptr, bias_ptr, picked_ptr, weights_ptr, tokens, num_shares, scale,
                   K: tl.constexpr, BLOCK_K: tl.constexpr, GROUPS: tl.constexpr, BLOCK_GROUPS: tl.constexpr,
                   KEPT_GROUPS: tl.constexpr, PER_GROUP: tl.constexpr, BLOCK_PER_GROUP: tl.constexpr,
                   NORMALIZE: tl.constexpr):
    """Padding (groups and experts per group up to powers of two) scores 0 and is never chosen."""
    token = tl.program_id(0)
    experts: tl.constexpr = GROUPS * PER_GROUP
    group = tl.arange(0, BLOCK_GROUPS)
    within = tl.arange(0, BLOCK_PER_GROUP)
    real = (group < GROUPS)[:, None] & (within < PER_GROUP)[None, :]
    expert = tl.where(real, group[:, None] * PER_GROUP + within[None, :], experts)  # [G, E / G]
    logits = tl.zeros((BLOCK_GROUPS, BLOCK_PER_GROUP), tl.float32)
    for share in range(num_shares):
        logits += tl.load(shares_ptr + (share * tokens + token) * experts + expert, mask=real, other=0.0)
    scores = tl.where(real, tl.sigmoid(logits), 0.0)
    choice = tl.where(real, scores + tl.load(bias_ptr + expert, mask=real, other=0.0), float("-inf"))
    if GROUPS > 1:
        top = tl.max(choice, axis=1)
        first = tl.min(tl.where(choice == top[:, None], expert, experts), axis=1)
        second = tl.max(tl.where(expert == first[:, None], float("-inf"), choice), axis=1)
        group_scores = top + second
        kept = group < 0
        for _ in tl.static_range(KEPT_GROUPS):
            best = tl.max(group_scores, axis=0)
            chosen_group = tl.min(tl.where(group_scores == best, group, BLOCK_GROUPS), axis=0)
            kept = kept | (group == chosen_group)
            group_scores = tl.where(group == chosen_group, float("-inf"), group_scores)
        choice = tl.where(kept[:, None], choice, float("-inf"))
    slot = tl.arange(0, BLOCK_K)
    top_scores = tl.zeros((BLOCK_K,), tl.float32)
    for pick in tl.static_range(K):
        largest = tl.max(tl.max(choice, axis=1), axis=0)
        chosen = tl.min(tl.min(tl.where(choice == largest, expert, experts), axis=1), axis=0)
        tl.store(picked_ptr + token * K + pick, chosen.to(tl.int64))
        score = tl.sum(tl.sum(tl.where(expert == chosen, scores, 0.0), axis=1), axis=0)
        top_scores = tl.where(slot == pick, score, top_scores)
        choice = tl.where(expert == chosen, float("-inf"), choice)
    if NORMALIZE:
        top_scores = top_scores / (tl.sum(top_scores, axis=0) + 1e-20)
    tl.store(weights_ptr + token * K + slot, (top_scores * scale).to(weights_ptr.dtype.element_ty), mask=slot < K)
