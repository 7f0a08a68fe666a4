"""The latent attention's norms + rotary + cache-write kernel against its torch reference, in Triton's interpreter
(see conftest.py): rope by interleaved pairs (GLM-4.7-Flash, GLM-5) and by halves, widths that are not powers of
two, rows written out of order."""

import pytest
import torch

from app.kernels.latent_cache import latent_cache_write, latent_cache_write_torch
from tests.kernels.poison import poisoned_allocations


@pytest.mark.parametrize("tokens, queries, latent, rope", [(1, 48, 32, 8), (3, 64, 24, 16), (2, 96, 64, 8)])
@pytest.mark.parametrize("interleaved", [True, False])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_latent_cache_write_matches_reference(tokens, queries, latent, rope, interleaved, dtype):
    generator = torch.Generator().manual_seed(queries + latent + rope + tokens)
    inputs = (torch.randn(tokens, queries + latent + rope, generator=generator) * 3).to(dtype)
    query_norm, latent_norm = 1 + torch.rand(queries, generator=generator), 1 + torch.rand(latent, generator=generator)
    angles = torch.rand(tokens, rope // 2, generator=generator) * 6
    cos, sin = angles.cos().to(dtype), angles.sin().to(dtype)
    positions = torch.tensor([6, 2, 9][:tokens])
    cache = torch.randn(12, latent + rope, generator=generator).to(dtype)
    latents, want_latents = cache.clone(), cache.clone()
    with poisoned_allocations():
        query_latent = latent_cache_write(inputs, query_norm, latent_norm, 1e-6, cos, sin, positions, latents,
                                          interleaved)
    want_query_latent = latent_cache_write_torch(inputs, query_norm, latent_norm, 1e-6, cos, sin, positions,
                                                 want_latents, interleaved)
    tolerance = 1e-5 if dtype == torch.float32 else 2e-2
    torch.testing.assert_close(query_latent, want_query_latent, rtol=tolerance, atol=tolerance)
    torch.testing.assert_close(latents, want_latents, rtol=tolerance, atol=tolerance)
    untouched = torch.ones(12, dtype=torch.bool)
    untouched[positions] = False
    assert torch.equal(latents[untouched], cache[untouched])
