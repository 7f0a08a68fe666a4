"""The decode attention kernel against its torch reference and the engine's attention, in Triton's interpreter
(see conftest.py): sinks or none, full or sliding windows, positions before, at and past a window and a block, groups
of query heads that are not powers of two."""

import pytest
import torch

from app.engine.layers.ops import attend, causal_mask
from app.kernels.decode_attention import decode_attention, decode_attention_torch, takes_queries
from tests.kernels.poison import poisoned_allocations

CAPACITY, HEADS, KV_HEADS, DIM = 150, 8, 2, 16


def random_case(dtype, seed, heads=HEADS, kv_heads=KV_HEADS):
    generator = torch.Generator().manual_seed(seed)
    q = torch.randn(1, heads, DIM, generator=generator).to(dtype)
    keys, values = (torch.randn(CAPACITY, kv_heads, DIM, generator=generator).to(dtype) for _ in range(2))
    sinks = torch.randn(heads, generator=generator).to(dtype)
    return q, keys, values, sinks


def assert_matches_reference_and_engine(q, keys, values, position, sinks, window):
    at = torch.tensor([position])
    with poisoned_allocations():
        out = decode_attention(q, keys, values, at, DIM**-0.5, sinks, window)
    torch.testing.assert_close(out, decode_attention_torch(q, keys, values, at, DIM**-0.5, sinks, window),
                               rtol=1e-5, atol=1e-6)
    seen = slice(0, position + 1)
    engine = attend(q, keys[seen], values[seen], causal_mask(at, position + 1, window), DIM**-0.5, sinks=sinks)
    torch.testing.assert_close(out, engine, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("position", [0, 5, 63, 64, 100, 149])
@pytest.mark.parametrize("window", [None, 16])
@pytest.mark.parametrize("with_sinks", [True, False])
def test_decode_attention_matches_reference(position, window, with_sinks):
    q, keys, values, sinks = random_case(torch.float32, position)
    assert_matches_reference_and_engine(q, keys, values, position, sinks if with_sinks else None, window)


# groups of query heads that are not powers of two on more than one key head (GLM-4.5-Air: 12 a key head): groups of
# 4 or a lone key head would not show a later key head's queries taken from the wrong rows; 3 key heads also round
# their shares (128 / 3) up to a power of two
@pytest.mark.parametrize(("heads", "kv_heads"), [(24, 2), (9, 3)])
@pytest.mark.parametrize("position", [77, 130])
@pytest.mark.parametrize("window", [None, 16])
def test_groups_that_are_not_powers_of_two_across_key_heads(heads, kv_heads, position, window):
    q, keys, values, sinks = random_case(torch.float32, position, heads, kv_heads)
    assert_matches_reference_and_engine(q, keys, values, position, sinks, window)


# a verify block: each query sees the keys up to its own position (the block's later rows masked, a window's start
# moving with it); blocks that start at 0, inside a step, across steps and windows, at the last row; 8 key heads x
# 16 tokens fill the kernel's 128 rows
@pytest.mark.parametrize(("tokens", "last", "kv_heads"), [(3, 2, 2), (5, 40, 2), (8, 70, 2), (16, 149, 1)])
@pytest.mark.parametrize("window", [None, 16])
def test_a_block_of_queries_sees_up_to_each_own_position(tokens, last, kv_heads, window):
    heads = HEADS if kv_heads == 2 else 8
    q, keys, values, sinks = random_case(torch.float32, last, heads, kv_heads)
    q = torch.randn(tokens, heads, DIM, generator=torch.Generator().manual_seed(last))
    at = torch.arange(last - tokens + 1, last + 1)
    assert takes_queries(tokens, heads, kv_heads)
    with poisoned_allocations():
        out = decode_attention(q, keys, values, at, DIM**-0.5, sinks, window)
    assert out.shape == (tokens, heads, DIM)
    torch.testing.assert_close(out, decode_attention_torch(q, keys, values, at, DIM**-0.5, sinks, window),
                               rtol=1e-5, atol=1e-6)
    seen = slice(0, last + 1)
    engine = attend(q, keys[seen], values[seen], causal_mask(at, last + 1, window), DIM**-0.5, sinks=sinks)
    torch.testing.assert_close(out, engine, rtol=1e-5, atol=1e-6)


def test_blocks_past_the_kernels_rows_are_left_to_the_engine():
    assert takes_queries(16, 64, 8) and not takes_queries(17, 64, 8)  # gpt-oss: 8 query heads a key head
    assert takes_queries(10, 96, 8) and not takes_queries(11, 96, 8)  # GLM-4.5-Air: 12


def test_decode_attention_in_bfloat16():
    q, keys, values, sinks = random_case(torch.bfloat16, 7)
    at = torch.tensor([120])
    out = decode_attention(q, keys, values, at, DIM**-0.5, sinks, 64)
    want = decode_attention_torch(q, keys, values, at, DIM**-0.5, sinks, 64)
    torch.testing.assert_close(out, want, rtol=2e-2, atol=2e-2)


# MLA (GLM-4.7-Flash's shape, smaller): one latent key head of 20 query heads, keys [latent + rope], the values the
# keys' first `latent` columns; positions inside the first block, across blocks and at the last row, and past 256
# rows, where the join adds more than one chunk of shares; a latent over 128 takes the wide tiles (GLM-4.7-Flash:
# 512) and its join two programs a head
@pytest.mark.parametrize(("position", "latent"), [(0, 64), (40, 64), (149, 64), (100, 256), (400, 256)])
def test_latent_attention_reads_values_from_the_keys(position, latent):
    rope, heads = 8, 20  # 8: narrower than a tensor-core product (tiny GLM-4.7-Flash)
    generator = torch.Generator().manual_seed(position)
    q = torch.randn(1, heads, latent + rope, generator=generator)
    rows = torch.randn(max(CAPACITY, position + 8), 1, latent + rope, generator=generator)
    at, scale = torch.tensor([position]), (latent + rope) ** -0.5
    with poisoned_allocations():
        out = decode_attention(q, rows, rows[..., :latent], at, scale, None, None)
    assert out.shape == (1, heads, latent)
    torch.testing.assert_close(out, decode_attention_torch(q, rows, rows[..., :latent], at, scale, None, None),
                               rtol=1e-5, atol=1e-6)
    seen = slice(0, position + 1)
    engine = attend(q, rows[seen], rows[seen, :, :latent], causal_mask(at, position + 1, None), scale)
    torch.testing.assert_close(out, engine, rtol=1e-5, atol=1e-6)


def test_values_apart_from_the_keys_may_be_narrower_and_strided():
    """dk = 32 as 16 + a second part of 16, dv = 16: values a view into wider rows, not the keys."""
    generator = torch.Generator().manual_seed(3)
    q = torch.randn(1, HEADS, 2 * DIM, generator=generator)
    keys = torch.randn(CAPACITY, KV_HEADS, 2 * DIM, generator=generator)
    values = torch.randn(CAPACITY, KV_HEADS, 4 * DIM, generator=generator)[..., :DIM]
    at = torch.tensor([77])
    out = decode_attention(q, keys, values, at, DIM**-0.5, None, None)
    assert out.shape == (1, HEADS, DIM)
    torch.testing.assert_close(out, decode_attention_torch(q, keys, values, at, DIM**-0.5, None, None),
                               rtol=1e-5, atol=1e-6)
