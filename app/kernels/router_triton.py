"""The top-k softmax router of router.py in Triton: the product, the k largest logits and their softmax in one
launch. At decode (up to DECODE_TOKENS tokens) the product is split over programs (router_shares_triton.py) and the
program that arrives last chooses for every token: one program per token read gpt-oss-20b's 184 KB router through
one SM in 7.2 us a layer (H200 profile, bench/NOTES.md), and -120b's is 4 times that. Longer passes take one program
per token, which keeps the logits in registers."""

import torch
import triton
import triton.language as tl

from app.kernels.dependent_launch import after_earlier_kernels, dependent_launch
from app.kernels.resident_slots_triton import look_up_slots
from app.kernels.router_shares_triton import DECODE_TOKENS, arrives_last, product_shares, split_launch

ELEMENTS_PER_STEP = 32768  # weights read per loop step: few steps (3 at 32 experts), ~64 registers a thread at 16 warps


def run_top_k_router(
    x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor, k: int,
    slot_row: torch.Tensor | None = None, uses: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """x [T, H], weight [E, H], bias [E] -> (experts [T, k] int64, softmax weights [T, k] in x's dtype, the picks'
    slots [1, k] where one token's are looked up in `slot_row` [E + 1] (resident_slots.py; `uses` [] int64 grows by
    those with a slot), else None)."""
    (tokens, hidden), experts = x.shape, weight.shape[0]
    assert weight.shape[1] == hidden and bias.shape == (experts,) and k <= experts
    x, weight = x.contiguous(), weight.contiguous()
    picked = torch.empty((tokens, k), dtype=torch.int64, device=x.device)
    weights = torch.empty((tokens, k), dtype=x.dtype, device=x.device)
    block_e = triton.next_power_of_2(experts)
    choice = dict(K=k, BLOCK_K=triton.next_power_of_2(k), BLOCK_EXPERTS=block_e)
    if tokens <= DECODE_TOKENS:
        split = split_launch(x, experts, picked, slot_row, uses)
        _split_router_kernel[split.grid](
            x, weight, *split.buffers, bias, picked, weights, *split.slot_pointers, tokens, hidden, experts,
            **split.constants, **choice, BLOCK_T=triton.next_power_of_2(tokens), num_warps=4,
            **dependent_launch(x.device),
        )
        return picked, weights, split.slots
    assert slot_row is None, "slots are looked up at decode"
    block_h = min(triton.next_power_of_2(hidden), max(64, ELEMENTS_PER_STEP // block_e))
    _top_k_router_kernel[(tokens,)](
        x, weight, bias, picked, weights, hidden, experts, BLOCK_H=block_h, **choice, num_warps=16,
        **dependent_launch(x.device),
    )
    return picked, weights, None


@triton.jit
def _split_router_kernel(x_ptr, weight_ptr, shares_ptr, arrivals_ptr, bias_ptr, picked_ptr, weights_ptr,
                         slot_row_ptr, uses_ptr, slots_ptr, tokens, hidden, experts, BLOCK_E: tl.constexpr,
                         BLOCK_H: tl.constexpr, K: tl.constexpr, BLOCK_K: tl.constexpr, BLOCK_EXPERTS: tl.constexpr,
                         BLOCK_T: tl.constexpr, HAS_SLOTS: tl.constexpr, PDL: tl.constexpr):
    """The program's shares, then, in the program that arrives last, the choice for every token at once (a verify
    block's tokens in turn took 16 us a layer at T = 8 on the H100, against 5 at T = 1; bench/NOTES.md) and one
    token's slots."""
    after_earlier_kernels(PDL)
    product_shares(x_ptr, weight_ptr, shares_ptr, tokens, hidden, experts, BLOCK_E, BLOCK_H)
    if arrives_last(arrivals_ptr):
        token = tl.arange(0, BLOCK_T)
        expert = tl.arange(0, BLOCK_EXPERTS)
        inside = (token < tokens)[:, None] & (expert < experts)[None, :]
        logits = tl.zeros((BLOCK_T, BLOCK_EXPERTS), tl.float32)
        for share in range(tl.num_programs(1)):
            logits += tl.load(shares_ptr + (share * tokens + token[:, None]) * experts + expert[None, :],
                              mask=inside, other=0.0, cache_modifier=".cg")
        _choose(logits, bias_ptr, picked_ptr, weights_ptr, token, tokens, experts, K, BLOCK_K, BLOCK_EXPERTS)
        if HAS_SLOTS:
            tl.debug_barrier()  # the picks just stored, read back by every thread
            look_up_slots(slot_row_ptr, picked_ptr, uses_ptr, slots_ptr, experts + 1, K, BLOCK_K)


@triton.jit
def _top_k_router_kernel(
    x_ptr, weight_ptr, bias_ptr, picked_ptr, weights_ptr, hidden, experts,
    K: tl.constexpr, BLOCK_K: tl.constexpr, BLOCK_EXPERTS: tl.constexpr, BLOCK_H: tl.constexpr,
    PDL: tl.constexpr,
):
    """One token's product in one program, then its choice."""
    after_earlier_kernels(PDL)
    token = tl.program_id(0).to(tl.int64)
    expert = tl.arange(0, BLOCK_EXPERTS)
    expert_ok = expert < experts
    acc = tl.zeros((BLOCK_EXPERTS, BLOCK_H), tl.float32)
    for start in range(0, hidden, BLOCK_H):
        columns = start + tl.arange(0, BLOCK_H)
        inside = columns < hidden
        x = tl.load(x_ptr + token * hidden + columns, mask=inside, other=0.0).to(tl.float32)
        w = tl.load(weight_ptr + expert[:, None] * hidden + columns[None, :],
                    mask=expert_ok[:, None] & inside[None, :], other=0.0).to(tl.float32)
        acc += w * x[None, :]
    products = tl.reshape(tl.sum(acc, axis=1), (1, BLOCK_EXPERTS))
    _choose(products, bias_ptr, picked_ptr, weights_ptr, token + tl.arange(0, 1), token + 1, experts, K, BLOCK_K,
            BLOCK_EXPERTS)


@triton.jit
def _choose(products, bias_ptr, picked_ptr, weights_ptr, token, tokens, experts, K: tl.constexpr,
            BLOCK_K: tl.constexpr, BLOCK_EXPERTS: tl.constexpr):
    """Each row's k largest logits (products [R, BLOCK_EXPERTS] float32 plus the bias; ties go to the lower expert)
    and the softmax over them, for the tokens token [R] below `tokens`."""
    expert = tl.arange(0, BLOCK_EXPERTS)
    expert_ok = expert < experts
    token_ok = token < tokens
    bias = tl.load(bias_ptr + expert, mask=expert_ok, other=0.0).to(tl.float32)
    # rounded to x's dtype, as the reference's product is, so that both pick among the same values
    logits = (products + bias[None, :]).to(weights_ptr.dtype.element_ty).to(tl.float32)
    logits = tl.where(expert_ok[None, :], logits, float("-inf"))
    slot = tl.arange(0, BLOCK_K)
    top = tl.full((products.shape[0], BLOCK_K), float("-inf"), tl.float32)
    for pick in tl.static_range(K):
        largest = tl.max(logits, axis=1)
        chosen = tl.min(tl.where(logits == largest[:, None], expert[None, :], BLOCK_EXPERTS), axis=1)
        tl.store(picked_ptr + token * K + pick, chosen.to(tl.int64), mask=token_ok)
        top = tl.where(slot[None, :] == pick, largest[:, None], top)
        logits = tl.where(expert[None, :] == chosen[:, None], float("-inf"), logits)
    # the first pick is the largest: the softmax's shift
    exps = tl.exp(top - tl.max(top, axis=1)[:, None])
    tl.store(weights_ptr + token[:, None] * K + slot[None, :],
             (exps / tl.sum(exps, axis=1)[:, None]).to(weights_ptr.dtype.element_ty),
             mask=token_ok[:, None] & (slot < K)[None, :])
