"""MLA's per-head products (queries into latent space with their rope dims rotated, the attention's output back
out of it) against the torch reference, in Triton's interpreter (see conftest.py): inputs and rows that are not
multiples of the kernel's steps, inputs strided as the query projection leaves them, rope by pairs and by halves."""

import pytest
import torch

from app.kernels.head_products import head_products, head_products_torch
from tests.kernels.poison import poisoned_allocations


@pytest.mark.parametrize("tokens, heads, rows, inputs, rope", [
    (1, 3, 64, 24, 8), (2, 2, 40, 160, 16), (1, 4, 24, 48, 0), (3, 2, 33, 136, 0),
])
@pytest.mark.parametrize("interleaved", [True, False])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_head_products_match_reference(tokens, heads, rows, inputs, rope, interleaved, dtype):
    if rope == 0 and not interleaved:
        pytest.skip("without rope dims nothing rotates")
    generator = torch.Generator().manual_seed(heads * rows + inputs + rope)
    # the queries' projection leaves [T, heads * (K + R)]: heads are views into its rows
    x = torch.randn(tokens, heads * (inputs + rope) + 5, generator=generator)[:, 5:].unflatten(-1, (heads, -1))
    x = x.to(dtype)
    weight = (torch.randn(heads, rows, inputs, generator=generator) * inputs**-0.5).to(dtype)
    cos = sin = None
    if rope:
        angles = torch.rand(tokens, rope // 2, generator=generator) * 6
        cos, sin = angles.cos().to(dtype), angles.sin().to(dtype)
    with poisoned_allocations():
        got = head_products(x, weight, cos, sin, interleaved)
    tolerance = 1e-5 if dtype == torch.float32 else 2e-2
    torch.testing.assert_close(got, head_products_torch(x, weight, cos, sin, interleaved), rtol=tolerance,
                               atol=tolerance)
