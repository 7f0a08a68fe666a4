"""The rotary + KV-cache write kernel against its torch reference, in Triton's interpreter (see conftest.py)."""

import pytest
import torch

from app.kernels.rotary_cache import rotary_cache_write, rotary_cache_write_torch
from tests.kernels.poison import poisoned_allocations


@pytest.mark.parametrize("tokens, heads, kv_heads, dim", [(1, 8, 2, 16), (3, 4, 4, 32)])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_rotary_cache_write_matches_reference(tokens, heads, kv_heads, dim, dtype):
    generator = torch.Generator().manual_seed(heads * dim)
    qkv = torch.randn(tokens, heads + 2 * kv_heads, dim, generator=generator).to(dtype)
    angles = torch.rand(tokens, dim // 2, generator=generator) * 6
    cos, sin = angles.cos().to(dtype), angles.sin().to(dtype)
    positions = torch.tensor([5, 2, 9][:tokens])
    caches = [torch.randn(12, kv_heads, dim, generator=generator).to(dtype) for _ in range(2)]
    keys, values = (cache.clone() for cache in caches)
    with poisoned_allocations():
        queries = rotary_cache_write(qkv, cos, sin, positions, keys, values)
    want_keys, want_values = (cache.clone() for cache in caches)
    want_queries = rotary_cache_write_torch(qkv, cos, sin, positions, want_keys, want_values)
    tolerance = 1e-6 if dtype == torch.float32 else 1e-2
    for got, want in ((queries, want_queries), (keys, want_keys)):
        torch.testing.assert_close(got, want, rtol=tolerance, atol=tolerance)
    assert torch.equal(values, want_values)
