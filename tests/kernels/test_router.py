"""The top-k softmax router kernel against its torch reference, in Triton's interpreter (see conftest.py)."""

import pytest
import torch

from app.kernels.router import top_k_router, top_k_router_torch
from tests.kernels.poison import poisoned_allocations


# up to 16 tokens (decode) the product is split over programs of 16 experts by 256 inputs (router_shares_triton.py):
# GPT-OSS-20B's router (2880 inputs, 32 experts: 12 shares, the last partial), 60 experts (a partial block), 128;
# past 16 tokens one program per token loops over the inputs in steps (1024 at 32 experts, 512 at 60 padded to 64),
# the last one partial
@pytest.mark.parametrize("tokens, hidden, experts, k", [
    (1, 96, 32, 4), (3, 200, 24, 4), (2, 64, 128, 3), (2, 2880, 32, 4), (1, 1000, 60, 6),
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
