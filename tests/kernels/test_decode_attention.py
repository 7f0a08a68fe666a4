"""The decode attention kernel against its torch reference and the engine's attention, in Triton's interpreter
(see conftest.py): sinks or none, full or sliding windows, positions before, at and past a window and a block."""

import pytest
import torch

from app.engine.layers.ops import attend, causal_mask
from app.kernels.decode_attention import decode_attention, decode_attention_torch
from tests.kernels.poison import poisoned_allocations

CAPACITY, HEADS, KV_HEADS, DIM = 150, 8, 2, 16


def random_case(dtype, seed):
    generator = torch.Generator().manual_seed(seed)
    q = torch.randn(1, HEADS, DIM, generator=generator).to(dtype)
    keys, values = (torch.randn(CAPACITY, KV_HEADS, DIM, generator=generator).to(dtype) for _ in range(2))
    sinks = torch.randn(HEADS, generator=generator).to(dtype)
    return q, keys, values, sinks


@pytest.mark.parametrize("position", [0, 5, 63, 64, 100, 149])
@pytest.mark.parametrize("window", [None, 16])
@pytest.mark.parametrize("with_sinks", [True, False])
def test_decode_attention_matches_reference(position, window, with_sinks):
    q, keys, values, sinks = random_case(torch.float32, position)
    sinks = sinks if with_sinks else None
    at = torch.tensor([position])
    with poisoned_allocations():
        out = decode_attention(q, keys, values, at, DIM**-0.5, sinks, window)
    torch.testing.assert_close(out, decode_attention_torch(q, keys, values, at, DIM**-0.5, sinks, window),
                               rtol=1e-5, atol=1e-6)
    seen = slice(0, position + 1)
    engine = attend(q, keys[seen], values[seen], causal_mask(at, position + 1, window), DIM**-0.5, sinks=sinks)
    torch.testing.assert_close(out, engine, rtol=1e-5, atol=1e-6)


def test_decode_attention_in_bfloat16():
    q, keys, values, sinks = random_case(torch.bfloat16, 7)
    at = torch.tensor([120])
    out = decode_attention(q, keys, values, at, DIM**-0.5, sinks, 64)
    want = decode_attention_torch(q, keys, values, at, DIM**-0.5, sinks, 64)
    torch.testing.assert_close(out, want, rtol=2e-2, atol=2e-2)
