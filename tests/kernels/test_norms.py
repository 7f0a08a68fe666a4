"""The add + RMSNorm kernel against its torch reference, in Triton's interpreter (see conftest.py)."""

import pytest
import torch

from app.kernels.expert_tiles import sum_picks
from app.kernels.mxfp4_half_pairs import half_pairs
from app.kernels.norms import add_rms_norm, add_rms_norm_half_pairs, add_rms_norm_torch
from app.kernels.pick_rows import PickRows
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


@pytest.mark.parametrize("tokens, picks", [(1, 4), (3, 2)])
def test_the_norm_adds_an_expert_ops_picks_as_their_sum_would_be_added(tokens, picks):
    """PickRows (pick_rows.py): the kernel sums each token's picks in pick order, skipped ones (never written)
    left out, and adds the sum rounded as `sum_picks` stores it: the same bits as summing first."""
    generator = torch.Generator().manual_seed(tokens * 10 + picks)
    x = torch.randn(tokens, 96, generator=generator).bfloat16()
    rows = torch.randn(tokens * picks, 96, generator=generator) * 3
    slots = torch.randint(0, 9, (tokens, picks), generator=generator)
    slots[0, 1] = -1
    rows[1] = float("nan")  # token 0's skipped pick: a row the op never wrote
    if tokens > 1:
        slots[1] = -1  # a token with all its picks skipped
    weight = torch.rand(96, generator=generator) + 0.5
    with poisoned_allocations():
        total, normed = add_rms_norm(x, PickRows(rows, slots), weight, 1e-5)
        want_total, want_normed = add_rms_norm(x, sum_picks(rows, slots, x.dtype), weight, 1e-5)
    assert torch.equal(total, want_total) and torch.equal(normed, want_normed)
    torch.testing.assert_close(total, add_rms_norm_torch(x, PickRows(rows, slots), weight, 1e-5)[0])
    if tokens > 1:
        assert torch.equal(total[1], x[1])
