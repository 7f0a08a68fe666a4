"""The compiled Triton SiLU-gated experts on a GPU, at widths near GLM-4.5-Air's, against the torch
reference; and the op captured in a CUDA graph. Skipped without a CUDA device (see conftest.py)."""

from dataclasses import replace

import pytest
import torch

from app.engine.experts.op_graph import SingleTokenGraph
from app.kernels import fp8_bytes
from app.kernels.fp8_products_triton import runs_fp8_products
from app.kernels.glu_experts import glu_experts, glu_experts_torch
from app.kernels.glu_experts_triton import pick_config, run_experts
from tests.kernels.poison import poisoned_allocations
from tests.kernels.test_glu_experts_triton import FORMATS, fp8_prefill_errors, random_arenas
from tests.kernels.test_gpt_oss_experts import random_routing, relative_error

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")

HIDDEN, WIDTH = 1024, 704  # 704 = 5.5 blocks of 128: partial scale blocks and tails at real tile sizes
SLOTS, PICKS = 24, 8
GPU_FORMATS = ("bf16", "per-channel", "block128")
FP8_INPUTS_ERROR = 8e-2  # x and the activations quantized to e4m3 (4 significant bits), against float32 inputs


def case(fmt: str, tokens: int, seed: int):
    generator = torch.Generator().manual_seed(seed)
    arenas = {name: t.cuda() for name, t in random_arenas(SLOTS, fmt, generator, HIDDEN, WIDTH).items()}
    slots, weights = random_routing(tokens, PICKS, SLOTS, generator)
    hidden = torch.randn(tokens, HIDDEN, generator=generator)
    return hidden.cuda(), arenas, slots.cuda(), weights.cuda()


@pytest.mark.parametrize("tokens", [1, 16, 100])  # decode, a verify block, a prefill chunk (32 pairs per tile)
@pytest.mark.parametrize("fmt", GPU_FORMATS)
def test_bfloat16_kernel_matches_float32_reference(fmt, tokens):
    """A prefill chunk of FP8 experts quantizes x and the activations (fp8_products_triton.py): it is checked
    launch by launch below."""
    hidden, arenas, slots, weights = case(fmt, tokens, tokens + len(fmt))
    with poisoned_allocations():
        out = glu_experts(hidden.bfloat16(), arenas, slots, weights.bfloat16(), fp8_block=FORMATS[fmt])
    ref = glu_experts_torch(hidden, arenas, slots, weights, fp8_block=FORMATS[fmt])
    assert out.dtype == torch.bfloat16 and out.isfinite().all()
    quantized = runs_fp8_products(hidden.bfloat16(), arenas["gate_proj.weight"])
    assert relative_error(out, ref) < (FP8_INPUTS_ERROR if quantized else 1e-2)
    if tokens > 1:
        assert (out[1] == 0).all()


@pytest.mark.parametrize("fmt", ["per-channel", "block128"])
def test_fp8_products_of_a_prefill_chunk_match_float32_products_of_their_quantized_inputs(fmt, monkeypatch):
    hidden, arenas, slots, weights = case(fmt, 100, 100 + len(fmt))
    if not runs_fp8_products(hidden.bfloat16(), arenas["gate_proj.weight"]):
        pytest.skip("no FP8 tensor cores (before sm_89)")
    out, errors = fp8_prefill_errors(hidden.bfloat16(), arenas, slots, weights.bfloat16(), FORMATS[fmt], monkeypatch)
    assert out.isfinite().all() and max(errors) < 1e-2


@pytest.mark.parametrize("tokens", [1, 100])
@pytest.mark.parametrize("fmt", ["per-channel", "block128"])
def test_fp8_experts_read_as_bytes_match_float32_reference(monkeypatch, fmt, tokens):
    """What a GPU before sm_89 runs (fp8_bytes.py), here on this one."""
    monkeypatch.setenv(fp8_bytes.FORCE, "1")
    hidden, arenas, slots, weights = case(fmt, tokens, tokens + 7)
    with poisoned_allocations():
        out = glu_experts(hidden.bfloat16(), arenas, slots, weights.bfloat16(), fp8_block=FORMATS[fmt])
    assert relative_error(out, glu_experts_torch(hidden, arenas, slots, weights, fp8_block=FORMATS[fmt])) < 1e-2


@pytest.mark.parametrize("fmt", ["per-channel", "block128"])
def test_bfloat16_products_match_float32_reference(fmt):
    """FP8 weights multiplied in bf16 rather than the default float16."""
    hidden, arenas, slots, weights = case(fmt, 16, 9)
    config = replace(pick_config(slots.numel()), fp16_products=False)
    with poisoned_allocations():
        out = run_experts(hidden.bfloat16(), arenas, slots, weights.bfloat16(), FORMATS[fmt], config)
    assert relative_error(out, glu_experts_torch(hidden, arenas, slots, weights, fp8_block=FORMATS[fmt])) < 1e-2


@pytest.mark.parametrize("fmt", GPU_FORMATS)
def test_float32_kernel_matches_float32_reference(fmt):
    hidden, arenas, slots, weights = case(fmt, 16, 7)
    with poisoned_allocations():
        out = glu_experts(hidden, arenas, slots, weights, fp8_block=FORMATS[fmt])
    assert relative_error(out, glu_experts_torch(hidden, arenas, slots, weights, fp8_block=FORMATS[fmt])) < 1e-4


def test_single_token_graph_replays_the_op_for_new_routings():
    hidden, arenas, slots, weights = case("block128", 1, 3)
    graph = SingleTokenGraph(
        lambda *args: glu_experts(*args, fp8_block=FORMATS["block128"]), arenas, hidden.bfloat16(), slots,
        weights.bfloat16(),
    )
    generator = torch.Generator().manual_seed(4)
    for _ in range(2):
        slots, weights = (t.cuda() for t in random_routing(1, PICKS, SLOTS, generator))
        hidden = torch.randn(1, HIDDEN, generator=generator).cuda()
        replayed = graph(hidden.bfloat16(), slots, weights.bfloat16()).clone()
        eager = glu_experts(hidden.bfloat16(), arenas, slots, weights.bfloat16(), fp8_block=FORMATS["block128"])
        assert torch.equal(replayed, eager)
