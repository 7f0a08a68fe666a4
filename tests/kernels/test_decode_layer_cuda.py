"""The decode-layer kernels (norms, router, rope_angles, rotary_cache, decode_attention) compiled on a GPU at
gpt-oss-20b's shapes (and the latent attention's, latent_cache and head_products at GLM-4.7-Flash's), against their
torch references. Skipped without a CUDA device."""

import pytest
import torch

from app.engine.layers.rope import rope_frequencies
from app.kernels.decode_attention import decode_attention, decode_attention_torch
from app.kernels.expert_tiles import sum_picks
from app.kernels.head_products import head_products, head_products_torch
from app.kernels.latent_cache import latent_cache_write, latent_cache_write_torch
from app.kernels.norms import add_rms_norm, add_rms_norm_torch
from app.kernels.pick_rows import PickRows
from app.kernels.rope_angles import rope_angles, rope_angles_torch
from app.kernels.rotary_cache import rotary_cache_write, rotary_cache_write_torch
from app.kernels.router import top_k_router, top_k_router_slots, top_k_router_slots_torch, top_k_router_torch
from app.kernels.sigmoid_router import (
    SigmoidRouting,
    sigmoid_router,
    sigmoid_router_slots,
    sigmoid_router_slots_torch,
    sigmoid_router_torch,
)
from tests.fixtures.tiny_gpt_oss import GPT_OSS_20B_CONFIG

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")

HIDDEN, EXPERTS, HEADS, KV_HEADS, DIM, CAPACITY = 2880, 32, 64, 8, 64, 700
TOLERANCE = {torch.float32: 2e-5, torch.bfloat16: 2e-2}


def random_rotation(tokens: int, rotary: int, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """cos, sin [tokens, rotary / 2] of random angles."""
    angles = torch.rand(tokens, rotary // 2, device="cuda") * 6
    return angles.cos().to(dtype), angles.sin().to(dtype)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("tokens", [1, 7])
@pytest.mark.parametrize("adds", [True, False], ids=["add", "norm-alone"])
def test_add_rms_norm(dtype, tokens, adds):
    x, delta = (torch.randn(tokens, HIDDEN, device="cuda").to(dtype) for _ in range(2))
    delta = delta if adds else None
    weight = torch.rand(HIDDEN, device="cuda") + 0.5
    total, normed = add_rms_norm(x, delta, weight, 1e-5)
    want_total, want_normed = add_rms_norm_torch(x, delta, weight, 1e-5)
    assert torch.equal(total, want_total)
    torch.testing.assert_close(normed, want_normed, rtol=TOLERANCE[dtype], atol=TOLERANCE[dtype])


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_rope_angles(dtype):
    """gpt-oss's YaRN cos and sin (rope_angles.py) at positions up to its context."""
    inv_freq, factor = rope_frequencies(DIM, GPT_OSS_20B_CONFIG["rope_theta"], GPT_OSS_20B_CONFIG["rope_scaling"])
    positions = torch.tensor([0, 1, 511, 4095, 70_000, 131_071], device="cuda")
    cos, sin = rope_angles(positions, inv_freq.cuda(), factor, dtype)
    want_cos, want_sin = rope_angles_torch(positions, inv_freq.cuda(), factor, dtype)
    tolerance = 1e-6 if dtype == torch.float32 else 2**-8
    torch.testing.assert_close(cos, want_cos, rtol=tolerance, atol=tolerance)
    torch.testing.assert_close(sin, want_sin, rtol=tolerance, atol=tolerance)


def test_add_rms_norm_adds_an_expert_ops_picks_as_their_sum():
    """gpt-oss's one-token experts hand the next norm their picks' rows (pick_rows.py): the same bits as summing
    them first (`sum_picks`), a skipped pick's unwritten row left out."""
    x = torch.randn(1, HIDDEN, device="cuda").bfloat16()
    rows = torch.randn(4, HIDDEN, device="cuda") * 3
    slots = torch.tensor([[3, -1, 7, 0]], device="cuda")
    rows[1] = float("nan")
    weight = torch.rand(HIDDEN, device="cuda") + 0.5
    total, normed = add_rms_norm(x, PickRows(rows, slots), weight, 1e-5)
    want_total, want_normed = add_rms_norm(x, sum_picks(rows, slots, x.dtype), weight, 1e-5)
    assert torch.equal(total, want_total) and torch.equal(normed, want_normed)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("tokens, experts", [(1, EXPERTS), (5, 128), (1, 128), (40, EXPERTS)])
def test_top_k_router(dtype, tokens, experts):
    """The split product at decode (gpt-oss-20b's and -120b's experts), one program per token past 16 tokens."""
    x = torch.randn(tokens, HIDDEN, device="cuda").to(dtype)
    weight = (torch.randn(experts, HIDDEN, device="cuda") * HIDDEN**-0.5).to(dtype)
    bias = torch.randn(experts, device="cuda").to(dtype)
    picked, weights = top_k_router(x, weight, bias, 4)
    want_picked, want_weights = top_k_router_torch(x, weight, bias, 4)
    if dtype == torch.float32:  # bf16 logits may tie, or round apart from cuBLAS's sum order
        assert torch.equal(picked, want_picked)
        torch.testing.assert_close(weights, want_weights, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("experts", [EXPERTS, 128])
def test_top_k_router_looks_up_slots_in_a_graph(experts):
    """The one launch that routes a token and looks its picks' slots up, replayed in a CUDA graph with new inputs
    (its arrival counter must be back at 0 after every launch)."""
    weight = (torch.randn(experts, HIDDEN, device="cuda") * HIDDEN**-0.5).float()
    bias = torch.randn(experts, device="cuda") * 0.1
    x = torch.randn(1, HIDDEN, device="cuda")
    slot_row = torch.randperm(experts + 1, device="cuda")
    slot_row[::3] = -1
    uses, want_uses = (torch.zeros((), dtype=torch.long, device="cuda") for _ in range(2))
    top_k_router_slots(x, weight, bias, 4, slot_row, uses.clone())  # compiles, and makes the arrival counter
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        static_picked, static_weights, static_slots = top_k_router_slots(x, weight, bias, 4, slot_row, uses)
    for seed in range(4):
        x.copy_(torch.randn(1, HIDDEN, generator=torch.Generator().manual_seed(seed)).cuda())
        graph.replay()
        want_picked, want_weights, want_slots = top_k_router_slots_torch(x, weight, bias, 4, slot_row, want_uses)
        assert torch.equal(static_picked, want_picked) and torch.equal(static_slots, want_slots)
        torch.testing.assert_close(static_weights, want_weights, rtol=1e-4, atol=1e-5)
    assert uses.item() == want_uses.item() > 0


def test_dependent_launches_read_what_the_launch_before_wrote():
    """Kernels launched dependent (PDL, dependent_launch.py) start while the one before them ends and must wait for
    its writes: a chain of 200 add + norms, each adding the last one's normed output, eagerly and replayed in a CUDA
    graph, equals the same chain of references."""
    x = torch.randn(1, HIDDEN, device="cuda")
    weight = torch.rand(HIDDEN, device="cuda") + 0.5

    def chain(add_norm):
        total, normed = x, torch.zeros_like(x)
        for _ in range(200):
            total, normed = add_norm(total, normed, weight, 1e-5)
        return total

    want = chain(add_rms_norm_torch)
    torch.testing.assert_close(chain(add_rms_norm), want, rtol=1e-4, atol=1e-4)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        replayed = chain(add_rms_norm)
    for _ in range(3):
        replayed.zero_()
        graph.replay()
        torch.testing.assert_close(replayed, want, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_rotary_cache_write(dtype):
    qkv = torch.randn(3, HEADS + 2 * KV_HEADS, DIM, device="cuda").to(dtype)
    cos, sin = random_rotation(3, DIM, dtype)
    positions = torch.tensor([17, 18, 19], device="cuda")
    keys, values = (torch.zeros(CAPACITY, KV_HEADS, DIM, device="cuda", dtype=dtype) for _ in range(2))
    want_keys, want_values = keys.clone(), values.clone()
    queries = rotary_cache_write(qkv, cos, sin, positions, keys, values)
    want_queries = rotary_cache_write_torch(qkv, cos, sin, positions, want_keys, want_values)
    for got, want in ((queries, want_queries), (keys, want_keys)):
        torch.testing.assert_close(got, want, rtol=TOLERANCE[dtype], atol=TOLERANCE[dtype])
    assert torch.equal(values, want_values)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("position", [0, 127, 128, 511, CAPACITY - 1])
@pytest.mark.parametrize("window", [None, 128])
def test_decode_attention(dtype, position, window):
    q = torch.randn(1, HEADS, DIM, device="cuda").to(dtype)
    keys, values = (torch.randn(CAPACITY, KV_HEADS, DIM, device="cuda").to(dtype) for _ in range(2))
    sinks = torch.randn(HEADS, device="cuda").to(dtype)
    at = torch.tensor([position], device="cuda")
    out = decode_attention(q, keys, values, at, DIM**-0.5, sinks, window)
    want = decode_attention_torch(q, keys, values, at, DIM**-0.5, sinks, window)
    torch.testing.assert_close(out, want, rtol=TOLERANCE[dtype], atol=TOLERANCE[dtype])


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize(("tokens", "last"), [(2, 1), (8, 300), (16, CAPACITY - 1)])
@pytest.mark.parametrize("window", [None, 128])
def test_decode_attention_of_a_verify_block(dtype, tokens, last, window):
    """gpt-oss's heads, a block of queries each seeing up to its own position."""
    q = torch.randn(tokens, HEADS, DIM, device="cuda").to(dtype)
    keys, values = (torch.randn(CAPACITY, KV_HEADS, DIM, device="cuda").to(dtype) for _ in range(2))
    sinks = torch.randn(HEADS, device="cuda").to(dtype)
    at = torch.arange(last - tokens + 1, last + 1, device="cuda")
    out = decode_attention(q, keys, values, at, DIM**-0.5, sinks, window)
    want = decode_attention_torch(q, keys, values, at, DIM**-0.5, sinks, window)
    torch.testing.assert_close(out, want, rtol=TOLERANCE[dtype], atol=TOLERANCE[dtype])


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("position", [0, 31, 511, 4000])
@pytest.mark.parametrize(("latent", "rope"), [(512, 64), (32, 8)], ids=["glm-4.7-flash", "tiny"])
def test_latent_decode_attention(dtype, position, latent, rope):
    """MLA: 20 query heads on one latent key head of latent + rope columns, the values its first `latent`:
    GLM-4.7-Flash's shapes (the wide tiles), and the tiny test model's, whose rope is narrower than a tensor-core
    product."""
    heads = 20
    q = torch.randn(1, heads, latent + rope, device="cuda").to(dtype)
    rows = torch.randn(4096, 1, latent + rope, device="cuda").to(dtype)
    at, scale = torch.tensor([position], device="cuda"), (192 + rope) ** -0.5
    out = decode_attention(q, rows, rows[..., :latent], at, scale, None, None)
    want = decode_attention_torch(q, rows, rows[..., :latent], at, scale, None, None)
    torch.testing.assert_close(out, want, rtol=TOLERANCE[dtype], atol=TOLERANCE[dtype])


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("tokens", [1, 5])
@pytest.mark.parametrize(("queries", "latent", "rope"), [(768, 512, 64), (2048, 512, 64), (48, 32, 8)],
                         ids=["glm-4.7-flash", "glm-5", "tiny"])
def test_latent_cache_write(dtype, tokens, queries, latent, rope):
    inputs = torch.randn(tokens, queries + latent + rope, device="cuda").to(dtype)
    query_norm, latent_norm = torch.rand(queries, device="cuda") + 0.5, torch.rand(latent, device="cuda") + 0.5
    cos, sin = random_rotation(tokens, rope, dtype)
    positions = torch.arange(tokens, device="cuda") * 3 + 100
    latents = torch.zeros(CAPACITY, latent + rope, device="cuda", dtype=dtype)
    want_latents = latents.clone()
    query_latent = latent_cache_write(inputs, query_norm, latent_norm, 1e-6, cos, sin, positions, latents, True)
    want = latent_cache_write_torch(inputs, query_norm, latent_norm, 1e-6, cos, sin, positions, want_latents, True)
    for got, wanted in ((query_latent, want), (latents, want_latents)):
        torch.testing.assert_close(got, wanted, rtol=TOLERANCE[dtype], atol=TOLERANCE[dtype])


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("tokens", [1, 8])
@pytest.mark.parametrize(("rows", "inputs", "rope"), [(512, 192, 64), (256, 512, 0), (32, 24, 8)],
                         ids=["glm-4.7-flash-queries", "glm-4.7-flash-values", "tiny-queries"])
def test_head_products(dtype, tokens, rows, inputs, rope):
    """MLA's 20 heads: the queries' nope dims into latent space with their rope dims rotated, and the attention's
    output back out of it."""
    heads = 20
    x = torch.randn(tokens, heads, inputs + rope, device="cuda").to(dtype)
    weight = (torch.randn(heads, rows, inputs, device="cuda") * inputs**-0.5).to(dtype)
    cos, sin = random_rotation(tokens, rope, dtype) if rope else (None, None)
    got, want = head_products(x, weight, cos, sin), head_products_torch(x, weight, cos, sin)
    torch.testing.assert_close(got, want, rtol=TOLERANCE[dtype], atol=TOLERANCE[dtype])


@pytest.mark.parametrize(("hidden", "experts", "routing"), [
    (2048, 64, SigmoidRouting(k=4, scale=1.8)), (4096, 128, SigmoidRouting(k=8, scale=1.0)),
    (6144, 256, SigmoidRouting(k=8, groups=8, kept_groups=4, scale=2.5)),
], ids=["glm-4.7-flash", "glm-4.5-air", "grouped"])
def test_sigmoid_router_in_one_launch(hidden, experts, routing):
    """At decode the program that finishes its shares last chooses: eagerly, and (looking the picks' slots up too)
    replayed in a CUDA graph with new inputs (its arrival counter must be back at 0 after every launch)."""
    weight = torch.randn(experts, hidden, device="cuda") * hidden**-0.5
    bias = torch.randn(experts, device="cuda") * 0.1
    x = torch.randn(1, hidden, device="cuda").bfloat16()
    for _ in range(3):
        picked, weights = sigmoid_router(x, weight, bias, routing)
        want_picked, want_weights = sigmoid_router_torch(x, weight, bias, routing)
        assert torch.equal(picked, want_picked)
        torch.testing.assert_close(weights, want_weights, rtol=1e-2, atol=1e-2)
    slot_row = torch.randperm(experts + 1, device="cuda")
    slot_row[::3] = -1
    uses, want_uses = (torch.zeros((), dtype=torch.long, device="cuda") for _ in range(2))
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        static_picked, static_weights, static_slots = sigmoid_router_slots(x, weight, bias, routing, slot_row, uses)
    for seed in range(4):
        x.copy_(torch.randn(1, hidden, generator=torch.Generator().manual_seed(seed)).bfloat16().cuda())
        graph.replay()
        want_picked, want_weights, want_slots = sigmoid_router_slots_torch(x, weight, bias, routing, slot_row,
                                                                           want_uses)
        assert torch.equal(static_picked, want_picked) and torch.equal(static_slots, want_slots)
        torch.testing.assert_close(static_weights, want_weights, rtol=1e-2, atol=1e-2)
    assert uses.item() == want_uses.item() > 0
