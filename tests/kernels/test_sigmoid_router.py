"""The sigmoid ("noaux_tc") router kernels against their torch reference, in Triton's interpreter (see
conftest.py): decode and longer passes, one group and group limits, normalised or not, scaled, expert and group
counts that are not powers of two (GLM-4.5's 160 experts)."""

import pytest
import torch

from app.kernels.sigmoid_router import (
    SigmoidRouting,
    sigmoid_router,
    sigmoid_router_slots,
    sigmoid_router_slots_torch,
    sigmoid_router_torch,
)
from tests.kernels.poison import poisoned_allocations


@pytest.mark.parametrize("tokens, hidden, experts, routing", [
    (1, 96, 32, SigmoidRouting(k=4)),
    (3, 300, 32, SigmoidRouting(k=8, normalize=False, scale=2.5)),
    (2, 64, 64, SigmoidRouting(k=6, groups=8, kept_groups=3, scale=1.8)),
    (20, 128, 16, SigmoidRouting(k=3, groups=4, kept_groups=2)),
    (1, 80, 20, SigmoidRouting(k=4, scale=2.5)),
    (2, 64, 24, SigmoidRouting(k=4, groups=3, kept_groups=2)),
    (1, 64, 24, SigmoidRouting(k=5, groups=4, kept_groups=3)),
    # past DECODE_TOKENS the choice has a launch of its own, which must pad experts and groups the same way
    (20, 96, 20, SigmoidRouting(k=4)),
    (17, 64, 24, SigmoidRouting(k=5, groups=4, kept_groups=3)),
])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_sigmoid_router_matches_reference(tokens, hidden, experts, routing, dtype):
    generator = torch.Generator().manual_seed(experts + routing.k + tokens)
    x = torch.randn(tokens, hidden, generator=generator).to(dtype)
    weight = torch.randn(experts, hidden, generator=generator) * hidden**-0.5
    bias = torch.randn(experts, generator=generator) * 0.1
    want_picked, want_weights = sigmoid_router_torch(x, weight, bias, routing)
    tolerance = 1e-5 if dtype == torch.float32 else 1e-2
    for _ in range(2):  # a decode launch leaves its arrival counter ready for the next
        with poisoned_allocations():
            picked, weights = sigmoid_router(x, weight, bias, routing)
        assert picked.dtype == torch.int64 and torch.equal(picked, want_picked)
        assert weights.dtype == dtype
        torch.testing.assert_close(weights, want_weights, rtol=tolerance, atol=tolerance)


@pytest.mark.parametrize("experts, routing", [
    (32, SigmoidRouting(k=4)), (24, SigmoidRouting(k=5, groups=4, kept_groups=3)),
])
def test_one_token_routing_looks_up_its_slots(experts, routing):
    """Every expert resident: the choosing program also reads the picks' slots from the cache's slot row (-1: an
    expert on another device) and counts those it found, as resident_slots would in a launch of its own."""
    generator = torch.Generator().manual_seed(experts)
    x = torch.randn(1, 96, generator=generator).to(torch.bfloat16)
    weight = torch.randn(experts, 96, generator=generator) * 96**-0.5
    bias = torch.randn(experts, generator=generator) * 0.1
    slot_row = torch.randperm(experts + 1, generator=generator)
    slot_row[sigmoid_router_torch(x, weight, bias, routing)[0][0, ::2]] = -1  # some picks have no slot
    uses, want_uses = torch.tensor(5), torch.tensor(5)
    for _ in range(2):
        with poisoned_allocations():
            picked, weights, slots = sigmoid_router_slots(x, weight, bias, routing, slot_row, uses)
        want_picked, want_weights, want_slots = sigmoid_router_slots_torch(x, weight, bias, routing, slot_row,
                                                                           want_uses)
        assert torch.equal(picked, want_picked) and torch.equal(slots, want_slots)
        torch.testing.assert_close(weights, want_weights, rtol=1e-2, atol=1e-2)
    assert (slots < 0).any() and (slots >= 0).any()
    assert uses.item() == want_uses.item() > 5
