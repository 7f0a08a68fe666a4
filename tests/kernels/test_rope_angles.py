"""The rotary cos/sin kernel against its torch reference, in Triton's interpreter (see conftest.py)."""

import pytest
import torch

from app.engine.layers.rope import rope_frequencies
from app.kernels.rope_angles import rope_angles, rope_angles_torch
from tests.fixtures.tiny_gpt_oss import GPT_OSS_20B_CONFIG
from tests.kernels.poison import poisoned_allocations

# gpt-oss's YaRN frequencies (attention factor above 1), and plain ones over 64 of a head's dims (GLM's partial RoPE)
FREQUENCIES = {
    "yarn": rope_frequencies(64, GPT_OSS_20B_CONFIG["rope_theta"], GPT_OSS_20B_CONFIG["rope_scaling"]),
    "plain": rope_frequencies(64, 1e6, None),
}


@pytest.mark.parametrize("frequencies", FREQUENCIES, ids=list(FREQUENCIES))
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_rope_angles_match_reference(frequencies, dtype):
    inv_freq, factor = FREQUENCIES[frequencies]
    positions = torch.tensor([0, 1, 511, 4095, 70_000, 131_071])  # the first, a decode step's, past YaRN's window
    with poisoned_allocations():
        cos, sin = rope_angles(positions, inv_freq, factor, dtype)
    want_cos, want_sin = rope_angles_torch(positions, inv_freq, factor, dtype)
    assert cos.dtype == sin.dtype == dtype and cos.shape == sin.shape == (len(positions), 32)
    # float32 cos and sin of the same float32 angles: a few ulps apart at most (bf16: the rounding of those)
    tolerance = 1e-6 if dtype == torch.float32 else 2**-8
    torch.testing.assert_close(cos, want_cos, rtol=tolerance, atol=tolerance)
    torch.testing.assert_close(sin, want_sin, rtol=tolerance, atol=tolerance)
    assert factor == 1.0 or not torch.allclose(cos[0], torch.ones(32, dtype=dtype))  # the factor is applied
