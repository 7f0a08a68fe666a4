"""The add + RMSNorm kernel against its torch reference, in Triton's interpreter (see conftest.py)."""

import pytest
import torch

from app.kernels.mxfp4_half_pairs import half_pairs
from app.kernels.norms import add_rms_norm, add_rms_norm_half_pairs, add_rms_norm_torch
from tests.kernels.poison import poisoned_allocations


@pytest.mark.parametrize("tokens, hidden", [(1, 96), (3, 200), (5, 64)])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("adds", [True, False], ids=["add", "norm-alone"])
def test_add_rms_norm_matches_reference(tokens, hidden, dtype, adds):
    generator = torch.Generator().manual_seed(tokens * hidden)
    x, delta = (torch.randn(tokens, hidden, generator=generator).to(dtype) for _ in range(2))
    delta = delta if adds else None
    weight = torch.rand(hidden, generator=generator) + 0.5
    with poisoned_allocations():
        total, normed = add_rms_norm(x, delta, weight, 1e-5)
    want_total, want_normed = add_rms_norm_torch(x, delta, weight, 1e-5)
    # the interpreter truncates float32 to bf16 (a GPU rounds to nearest, test_decode_layer_cuda.py): one ulp
    tolerance = 1e-5 if dtype == torch.float32 else 1e-2
    torch.testing.assert_close(total, want_total, rtol=tolerance, atol=tolerance)
    torch.testing.assert_close(normed, want_normed, rtol=tolerance, atol=tolerance)


@pytest.mark.parametrize("tokens, hidden", [(1, 2880), (2, 96)])
def test_the_norm_in_half_pairs_is_the_separate_conversion_of_the_norm(tokens, hidden):
    generator = torch.Generator().manual_seed(hidden)
    x, delta = (torch.randn(tokens, hidden, generator=generator).bfloat16() for _ in range(2))
    weight = torch.rand(hidden, generator=generator) * 8  # norms past 2^3: the pairs' scaling shifts
    with poisoned_allocations():
        total, normed, (pairs, unscale) = add_rms_norm_half_pairs(x, delta, weight, 1e-5)
        want_total, want_normed = add_rms_norm(x, delta, weight, 1e-5)
        want_pairs, want_unscale = half_pairs(want_normed)
    assert torch.equal(total, want_total) and torch.equal(normed, want_normed)
    assert torch.equal(pairs, want_pairs) and torch.equal(unscale, want_unscale)
