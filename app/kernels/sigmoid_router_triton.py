"""The sigmoid router of sigmoid_router.py in Triton. The product: at decode (up to DECODE_TOKENS tokens) split over
programs (router_shares_triton.py), the program that arrives last choosing for every token in the same launch;
longer passes take cuBLAS's product as one share and a choice launch. The choice: per token, sums the shares and
picks, in float32, with the experts laid out as [groups, experts per group] (a longer pass's on one warp, where its
many small reductions stay)."""

import torch
import triton
import triton.language as tl

from app.kernels.dependent_launch import after_earlier_kernels, dependent_launch
from app.kernels.resident_slots_triton import look_up_slots
from app.kernels.router_shares_triton import DECODE_TOKENS, arrives_last, product_shares, split_launch
from app.kernels.sigmoid_router import SigmoidRouting


def run_sigmoid_router(
    x: torch.Tensor, weight: torch.Tensor, correction_bias: torch.Tensor, routing: SigmoidRouting,
    slot_row: torch.Tensor | None = None, uses: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """x [T, H], weight [E, H] float32, correction_bias [E] float32 -> (experts [T, k] int64, weights [T, k], the
    picks' slots [1, k] where one token's are looked up in `slot_row` [E + 1] (resident_slots.py; `uses` [] int64
    grows by those with a slot), else None)."""
    (tokens, hidden), experts = x.shape, weight.shape[0]
    per_group = experts // routing.groups
    assert weight.shape[1] == hidden and correction_bias.shape == (experts,) and routing.k <= experts
    assert experts % routing.groups == 0 and (routing.groups == 1 or per_group >= 2)
    x = x.contiguous()
    picked = torch.empty((tokens, routing.k), dtype=torch.int64, device=x.device)
    weights = torch.empty((tokens, routing.k), dtype=x.dtype, device=x.device)
    choice = dict(K=routing.k, BLOCK_K=triton.next_power_of_2(routing.k), GROUPS=routing.groups,
                  BLOCK_GROUPS=triton.next_power_of_2(routing.groups), KEPT_GROUPS=routing.kept_groups,
                  PER_GROUP=per_group, BLOCK_PER_GROUP=triton.next_power_of_2(per_group), NORMALIZE=routing.normalize)
    if tokens > DECODE_TOKENS:
        assert slot_row is None, "slots are looked up at decode"
        shares = (x.float() @ weight.T)[None]
        _choice_kernel[(tokens,)](shares, correction_bias.contiguous(), picked, weights, tokens, 1, routing.scale,
                                  **choice, num_warps=1, **dependent_launch(x.device))
        return picked, weights, None
    split = split_launch(x, experts, picked, slot_row, uses)
    _route_kernel[split.grid](
        x, weight.contiguous(), *split.buffers, correction_bias.contiguous(), picked, weights, *split.slot_pointers,
        tokens, hidden, experts, routing.scale, **split.constants, **choice, num_warps=4, **dependent_launch(x.device),
    )
    return picked, weights, split.slots


@triton.jit
def _route_kernel(x_ptr, weight_ptr, shares_ptr, arrivals_ptr, bias_ptr, picked_ptr, weights_ptr, slot_row_ptr,
                  uses_ptr, slots_ptr, tokens, hidden, experts, scale, BLOCK_E: tl.constexpr, BLOCK_H: tl.constexpr,
                  K: tl.constexpr, BLOCK_K: tl.constexpr, GROUPS: tl.constexpr, BLOCK_GROUPS: tl.constexpr,
                  KEPT_GROUPS: tl.constexpr, PER_GROUP: tl.constexpr, BLOCK_PER_GROUP: tl.constexpr,
                  NORMALIZE: tl.constexpr, HAS_SLOTS: tl.constexpr, PDL: tl.constexpr):
    """The program's shares, then, in the program that arrives last, the choice for every token (and one token's
    slots)."""
    after_earlier_kernels(PDL)
    product_shares(x_ptr, weight_ptr, shares_ptr, tokens, hidden, experts, BLOCK_E, BLOCK_H)
    if arrives_last(arrivals_ptr):
        for token in range(tokens):
            _choose(shares_ptr, bias_ptr, picked_ptr, weights_ptr, token, tokens, tl.num_programs(1), scale, K,
                    BLOCK_K, GROUPS, BLOCK_GROUPS, KEPT_GROUPS, PER_GROUP, BLOCK_PER_GROUP, NORMALIZE)
        if HAS_SLOTS:
            tl.debug_barrier()  # the picks just stored, read back by every thread
            look_up_slots(slot_row_ptr, picked_ptr, uses_ptr, slots_ptr, experts + 1, K, BLOCK_K)


@triton.jit
def _choice_kernel(shares_ptr, bias_ptr, picked_ptr, weights_ptr, tokens, num_shares, scale,
                   K: tl.constexpr, BLOCK_K: tl.constexpr, GROUPS: tl.constexpr, BLOCK_GROUPS: tl.constexpr,
                   KEPT_GROUPS: tl.constexpr, PER_GROUP: tl.constexpr, BLOCK_PER_GROUP: tl.constexpr,
                   NORMALIZE: tl.constexpr, PDL: tl.constexpr):
    after_earlier_kernels(PDL)
    _choose(shares_ptr, bias_ptr, picked_ptr, weights_ptr, tl.program_id(0), tokens, num_shares, scale, K, BLOCK_K,
            GROUPS, BLOCK_GROUPS, KEPT_GROUPS, PER_GROUP, BLOCK_PER_GROUP, NORMALIZE)


@triton.jit
def _choose(shares_ptr, bias_ptr, picked_ptr, weights_ptr, token, tokens, num_shares, scale,
            K: tl.constexpr, BLOCK_K: tl.constexpr, GROUPS: tl.constexpr, BLOCK_GROUPS: tl.constexpr,
            KEPT_GROUPS: tl.constexpr, PER_GROUP: tl.constexpr, BLOCK_PER_GROUP: tl.constexpr,
            NORMALIZE: tl.constexpr):
    """One token's picks and weights. Padding (groups and experts per group up to powers of two) scores 0 and is
    never chosen. The shares are read from L2 (.cg, `arrives_last`)."""
    experts: tl.constexpr = GROUPS * PER_GROUP
    group = tl.arange(0, BLOCK_GROUPS)
    within = tl.arange(0, BLOCK_PER_GROUP)
    real = (group < GROUPS)[:, None] & (within < PER_GROUP)[None, :]
    expert = tl.where(real, group[:, None] * PER_GROUP + within[None, :], experts)  # [G, E / G]
    logits = tl.zeros((BLOCK_GROUPS, BLOCK_PER_GROUP), tl.float32)
    for share in range(num_shares):
        logits += tl.load(shares_ptr + (share * tokens + token) * experts + expert, mask=real, other=0.0,
                          cache_modifier=".cg")
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
