"""The sigmoid ("noaux_tc") router kernels against their torch reference, in Triton's interpreter (see
conftest.py): decode and longer passes, one group and group limits, normalised or not, scaled, expert and group
counts that are not powers of two (GLM-4.5's 160 experts)."""

import pytest
import torch

from app.kernels.sigmoid_router import SigmoidRouting, sigmoid_router, sigmoid_router_torch
from tests.kernels.poison import poisoned_allocations


@pytest.mark.parametrize("tokens, hidden, experts, routing", [
    (1, 96, 32, SigmoidRouting(k=4)),
    (3, 300, 32, SigmoidRouting(k=8, normalize=False, scale=2.5)),
    (2, 64, 64, SigmoidRouting(k=6, groups=8, kept_groups=3, scale=1.8)),
    (20, 128, 16, SigmoidRouting(k=3, groups=4, kept_groups=2)),
    (1, 80, 20, SigmoidRouting(k=4, scale=2.5)),
    (2, 64, 24, SigmoidRouting(k=4, groups=3, kept_groups=2)),
    (1, 64, 24, SigmoidRouting(k=5, groups=4, kept_groups=3)),
])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_sigmoid_router_matches_reference(tokens, hidden, experts, routing, dtype):
    generator = torch.Generator().manual_seed(experts + routing.k + tokens)
    x = torch.randn(tokens, hidden, generator=generator).to(dtype)
    weight = torch.randn(experts, hidden, generator=generator) * hidden**-0.5
    bias = torch.randn(experts, generator=generator) * 0.1
    with poisoned_allocations():
        picked, weights = sigmoid_router(x, weight, bias, routing)
    want_picked, want_weights = sigmoid_router_torch(x, weight, bias, routing)
    assert picked.dtype == torch.int64 and torch.equal(picked, want_picked)
    assert weights.dtype == dtype
    tolerance = 1e-5 if dtype == torch.float32 else 1e-2
    torch.testing.assert_close(weights, want_weights, rtol=tolerance, atol=tolerance)
