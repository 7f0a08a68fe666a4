"""The top-k softmax router kernel against its torch reference, in Triton's interpreter (see conftest.py)."""

import pytest
import torch

from app.kernels.router import top_k_router, top_k_router_slots, top_k_router_slots_torch, top_k_router_torch
from tests.kernels.poison import poisoned_allocations


# up to 16 tokens (decode) the product is split over programs of 16 experts by 256 inputs (router_shares_triton.py):
# GPT-OSS-20B's router (2880 inputs, 32 experts: 12 shares, the last partial; 8 tokens: a verify block, chosen at
# once by the last program), 60 experts (a partial block; 16 tokens, the most split), 128;
# past 16 tokens one program per token loops over the inputs in steps (1024 at 32 experts, 512 at 60 padded to 64),
# the last one partial
@pytest.mark.parametrize("tokens, hidden, experts, k", [
    (1, 96, 32, 4), (3, 200, 24, 4), (2, 64, 128, 3), (2, 2880, 32, 4), (1, 1000, 60, 6), (8, 2880, 32, 4),
    (16, 200, 60, 6),
    (17, 2880, 32, 4), (20, 1000, 60, 6),
])
def test_top_k_router_matches_reference(tokens, hidden, experts, k):
    generator = torch.Generator().manual_seed(experts + k)
    x = torch.randn(tokens, hidden, generator=generator)
    weight = torch.randn(experts, hidden, generator=generator) * hidden**-0.5
    bias = torch.randn(experts, generator=generator)
    with poisoned_allocations():
        picked, weights = top_k_router(x, weight, bias, k)
    want_picked, want_weights = top_k_router_torch(x, weight, bias, k)
    assert picked.dtype == torch.int64 and torch.equal(picked, want_picked)
    torch.testing.assert_close(weights, want_weights, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("hidden, experts", [(96, 32), (600, 60)])
def test_one_token_routing_looks_up_its_slots(hidden, experts):
    """Every expert resident: the choosing program also reads the picks' slots from the cache's slot row (-1: an
    expert on another device) and counts those it found, as resident_slots would in a launch of its own."""
    generator = torch.Generator().manual_seed(experts)
    x = torch.randn(1, hidden, generator=generator).to(torch.bfloat16)
    weight = (torch.randn(experts, hidden, generator=generator) * hidden**-0.5).to(torch.bfloat16)
    bias = (torch.randn(experts, generator=generator) * 0.1).to(torch.bfloat16)
    slot_row = torch.randperm(experts + 1, generator=generator)
    slot_row[top_k_router_torch(x, weight, bias, 4)[0][0, ::2]] = -1  # some picks have no slot
    uses, want_uses = torch.tensor(5), torch.tensor(5)
    for _ in range(2):
        with poisoned_allocations():
            picked, weights, slots = top_k_router_slots(x, weight, bias, 4, slot_row, uses)
        want_picked, want_weights, want_slots = top_k_router_slots_torch(x, weight, bias, 4, slot_row, want_uses)
        assert torch.equal(picked, want_picked) and torch.equal(slots, want_slots)
        torch.testing.assert_close(weights, want_weights, rtol=1e-2, atol=1e-2)
    assert (slots < 0).any() and (slots >= 0).any()
    assert uses.item() == want_uses.item() > 5
