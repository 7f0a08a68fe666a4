"""The sigmoid router of sigmoid_router.py in Triton. The product: at decode (up to DECODE_TOKENS tokens) programs
over (block of experts, share of the inputs) each read their piece of the float32 weight once and write partial sums
for every token (GLM-4.5-Air's 2 MB router in 128 programs; one program per token would read it through one SM);
longer passes take cuBLAS's product as one share. The choice: per token, sums the shares and picks, in float32,
with the experts laid out as [groups, experts per group] (a longer pass's on one warp, where its many small
reductions stay).
At decode both are one launch: the program that finishes its shares last (an arrival counter) chooses for every
token, and sets the counter back to 0 for the next launch. So decode launches share one counter a device and must
not run concurrently (the engine routes on one stream)."""

import torch
import triton
import triton.language as tl

from app.kernels.dependent_launch import after_earlier_kernels, dependent_launch
from app.kernels.resident_slots_triton import look_up_slots
from app.kernels.sigmoid_router import SigmoidRouting

DECODE_TOKENS = 16
BLOCK_E = 16  # experts per product program
BLOCK_H = 256  # inputs per product program


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
    assert slot_row is None or (tokens == 1 and slot_row.shape == (experts + 1,) and slot_row.is_contiguous()
                                and slot_row.dtype == uses.dtype == torch.int64 and uses.numel() == 1), \
        "one token's slots from a row [E + 1] int64, counted in `uses` [] int64"
    x = x.contiguous()
    picked = torch.empty((tokens, routing.k), dtype=torch.int64, device=x.device)
    weights = torch.empty((tokens, routing.k), dtype=x.dtype, device=x.device)
    choice = dict(K=routing.k, BLOCK_K=triton.next_power_of_2(routing.k), GROUPS=routing.groups,
                  BLOCK_GROUPS=triton.next_power_of_2(routing.groups), KEPT_GROUPS=routing.kept_groups,
                  PER_GROUP=per_group, BLOCK_PER_GROUP=triton.next_power_of_2(per_group), NORMALIZE=routing.normalize)
    if tokens > DECODE_TOKENS:
        shares = (x.float() @ weight.T)[None]
        _choice_kernel[(tokens,)](shares, correction_bias.contiguous(), picked, weights, tokens, 1, routing.scale,
                                  **choice, num_warps=1, **dependent_launch(x.device))
        return picked, weights, None
    shares = torch.empty((triton.cdiv(hidden, BLOCK_H), tokens, experts), dtype=torch.float32, device=x.device)
    slots = None if slot_row is None else torch.empty((1, routing.k), dtype=torch.int64, device=x.device)
    _route_kernel[(triton.cdiv(experts, BLOCK_E), shares.shape[0])](
        x, weight.contiguous(), shares, _arrivals(x.device), correction_bias.contiguous(), picked, weights,
        picked if slot_row is None else slot_row, picked if uses is None else uses, picked if slots is None else slots,
        tokens, hidden, experts, routing.scale, BLOCK_E=BLOCK_E, BLOCK_H=BLOCK_H, **choice,
        HAS_SLOTS=slot_row is not None, num_warps=4, **dependent_launch(x.device),
    )
    return picked, weights, slots


_ARRIVALS: dict[torch.device, torch.Tensor] = {}


def _arrivals(device: torch.device) -> torch.Tensor:
    """The device's arrival counter [1] int32: 0 between launches (the last program resets it)."""
    if device not in _ARRIVALS:
        # a capture would record the zeroing instead of running it: the first launch must come before any capture
        assert device.type != "cuda" or not torch.cuda.is_current_stream_capturing(), "route once before capturing"
        _ARRIVALS[device] = torch.zeros(1, dtype=torch.int32, device=device)
    return _ARRIVALS[device]


@triton.jit
def _route_kernel(x_ptr, weight_ptr, shares_ptr, arrivals_ptr, bias_ptr, picked_ptr, weights_ptr, slot_row_ptr,
                  uses_ptr, slots_ptr, tokens, hidden, experts, scale, BLOCK_E: tl.constexpr, BLOCK_H: tl.constexpr,
                  K: tl.constexpr, BLOCK_K: tl.constexpr, GROUPS: tl.constexpr, BLOCK_GROUPS: tl.constexpr,
                  KEPT_GROUPS: tl.constexpr, PER_GROUP: tl.constexpr, BLOCK_PER_GROUP: tl.constexpr,
                  NORMALIZE: tl.constexpr, HAS_SLOTS: tl.constexpr, PDL: tl.constexpr):
    """The program's shares, then, in the program that arrives last, the choice for every token (and one token's
    slots)."""
    after_earlier_kernels(PDL)
    _product(x_ptr, weight_ptr, shares_ptr, tokens, hidden, experts, BLOCK_E, BLOCK_H)
    tl.debug_barrier()  # every thread's shares are written before the arrival that publishes them
    programs = tl.num_programs(0) * tl.num_programs(1)
    if tl.atomic_add(arrivals_ptr, 1, sem="acq_rel") == programs - 1:
        tl.store(arrivals_ptr, 0)
        for token in range(tokens):
            _choose(shares_ptr, bias_ptr, picked_ptr, weights_ptr, token, tokens, tl.num_programs(1), scale, K,
                    BLOCK_K, GROUPS, BLOCK_GROUPS, KEPT_GROUPS, PER_GROUP, BLOCK_PER_GROUP, NORMALIZE)
        if HAS_SLOTS:
            tl.debug_barrier()  # the picks just stored, read back by every thread
            look_up_slots(slot_row_ptr, picked_ptr, uses_ptr, slots_ptr, experts + 1, K, BLOCK_K)


@triton.jit
def _product(x_ptr, weight_ptr, shares_ptr, tokens, hidden, experts, BLOCK_E: tl.constexpr, BLOCK_H: tl.constexpr):
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
    never chosen. The shares are read from L2 (.cg): other programs of the same launch wrote them."""
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
