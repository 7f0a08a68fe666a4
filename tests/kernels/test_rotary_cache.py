"""The rotary + KV-cache write kernel against its torch reference, in Triton's interpreter (see conftest.py):
whole and partial rotation (GPT-OSS, GLM), with GLM's q/k/v bias and per-head q/k RMSNorm."""

import pytest
import torch

from app.kernels.rotary_cache import rotary_cache_write, rotary_cache_write_torch
from tests.kernels.poison import poisoned_allocations


@pytest.mark.parametrize("tokens, heads, kv_heads, dim, rotary", [
    (1, 8, 2, 16, 16), (3, 4, 4, 32, 32), (1, 12, 2, 32, 16), (2, 6, 2, 16, 8),
])
@pytest.mark.parametrize("with_bias, with_norms", [(False, False), (True, False), (True, True)])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_rotary_cache_write_matches_reference(tokens, heads, kv_heads, dim, rotary, with_bias, with_norms, dtype):
    generator = torch.Generator().manual_seed(heads * dim + rotary)
    qkv = torch.randn(tokens, heads + 2 * kv_heads, dim, generator=generator).to(dtype)
    angles = torch.rand(tokens, rotary // 2, generator=generator) * 6
    cos, sin = angles.cos().to(dtype), angles.sin().to(dtype)
    positions = torch.tensor([5, 2, 9][:tokens])
    caches = [torch.randn(12, kv_heads, dim, generator=generator).to(dtype) for _ in range(2)]
    bias = torch.randn(qkv[0].numel(), generator=generator).to(dtype) if with_bias else None
    norms = 1 + torch.rand(2, dim, generator=generator) if with_norms else None
    keys, values = (cache.clone() for cache in caches)
    with poisoned_allocations():
        queries = rotary_cache_write(qkv, cos, sin, positions, keys, values, bias, norms, 1e-5)
    want_keys, want_values = (cache.clone() for cache in caches)
    want_queries = rotary_cache_write_torch(qkv, cos, sin, positions, want_keys, want_values, bias, norms, 1e-5)
    tolerance = 1e-5 if dtype == torch.float32 else 2e-2
    for got, want in ((queries, want_queries), (keys, want_keys), (values, want_values)):
        torch.testing.assert_close(got, want, rtol=tolerance, atol=tolerance)
    untouched = torch.ones(12, dtype=torch.bool)
    untouched[positions] = False
    assert torch.equal(keys[untouched], caches[0][untouched]) and torch.equal(values[untouched], caches[1][untouched])
