"""The compiled FP8 linear kernel on a GPU at GLM-4.5-Air's dense shapes against the float32 torch reference,
captured in a CUDA graph, and GLM keeping its dense FP8 weights FP8 on the GPU. Skipped without a CUDA device."""

import pytest
import torch

from app.engine.layers.linear import Fp8Weight
from app.engine.loader import load_model
from app.kernels import fp8_bytes
from app.kernels.fp8_linear import fp8_linear, fp8_linear_torch
from app.kernels.fp8_products_triton import quantize_activations, runs_fp8_products
from app.model_folder import ModelFolder
from tests.fixtures.tiny_glm import write_tiny_glm
from tests.kernels.poison import poisoned_allocations
from tests.kernels.test_fp8_linear import FORMATS, random_fp8_linear
from tests.kernels.test_fp8_prefill import awkward_activations, dequantized_activations, quantize_reference
from tests.kernels.test_gpt_oss_experts import relative_error

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")

# zai-org/GLM-4.5-Air-FP8: q_proj, k_proj, o_proj, the dense MLP's down_proj, the shared expert's gate_proj
AIR_SHAPES = [(12288, 4096), (1024, 4096), (4096, 12288), (4096, 10944), (1408, 4096)]
GPU_FORMATS = ("per-channel", "block128")


def case(out: int, inputs: int, fmt: str, tokens: int, seed: int):
    generator = torch.Generator().manual_seed(seed)
    weight, scale = random_fp8_linear(out, inputs, fmt, generator)
    return torch.randn(tokens, inputs, generator=generator).cuda(), weight.cuda(), scale.cuda()


@pytest.mark.parametrize("tokens", [1, 16, 128])  # decode (split-K), a verify block, a prefill chunk
@pytest.mark.parametrize("fmt", GPU_FORMATS)
@pytest.mark.parametrize("shape", AIR_SHAPES)
def test_bfloat16_kernel_matches_float32_reference(shape, fmt, tokens):
    """A prefill chunk's x is quantized (fp8_products_triton.py): the reference multiplies x as quantized."""
    x, weight, scale = case(*shape, fmt, tokens, seed=tokens + shape[0])
    with poisoned_allocations():
        y = fp8_linear(x.bfloat16(), weight, scale, FORMATS[fmt])
    assert y.dtype == torch.bfloat16 and y.isfinite().all()
    if runs_fp8_products(x.bfloat16(), weight):
        x = dequantized_activations(x.bfloat16())
    assert relative_error(y, fp8_linear_torch(x, weight, scale, FORMATS[fmt])) < 1e-2


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_compiled_quantization_of_a_prefill_chunk_gives_the_nearest_e4m3_values(dtype):
    """The rounding is float32 arithmetic that a compiler must not fold away (fp8_products_triton.py)."""
    x = awkward_activations(dtype).cuda()
    with poisoned_allocations():
        q, scale = quantize_activations(x)
    ref_q, ref_scale = quantize_reference(x)
    torch.testing.assert_close(scale, ref_scale, rtol=0, atol=0)
    assert torch.equal(q.float(), ref_q.float())


@pytest.mark.parametrize("tokens", [1, 16, 128])
@pytest.mark.parametrize("fmt", GPU_FORMATS)
def test_fp8_weights_read_as_bytes_match_float32_reference(monkeypatch, fmt, tokens):
    """What a GPU before sm_89 runs (fp8_bytes.py), here on this one, at q_proj's shape."""
    monkeypatch.setenv(fp8_bytes.FORCE, "1")
    x, weight, scale = case(12288, 4096, fmt, tokens, seed=tokens + 3)
    with poisoned_allocations():
        y = fp8_linear(x.bfloat16(), weight, scale, FORMATS[fmt])
    assert relative_error(y, fp8_linear_torch(x, weight, scale, FORMATS[fmt])) < 1e-2


@pytest.mark.parametrize("fmt", GPU_FORMATS)
def test_float32_kernel_matches_float32_reference(fmt):
    x, weight, scale = case(1024, 4096, fmt, 16, seed=5)
    with poisoned_allocations():
        y = fp8_linear(x, weight, scale, FORMATS[fmt])
    assert relative_error(y, fp8_linear_torch(x, weight, scale, FORMATS[fmt])) < 1e-4


@pytest.mark.parametrize("tokens", [1, 128])
def test_captured_graph_replays_the_eager_result_for_new_inputs(tokens):
    x, weight, scale = case(1024, 4096, "block128", tokens, seed=9)
    static_x = x.bfloat16()
    run = lambda: fp8_linear(static_x, weight, scale, FORMATS["block128"])  # noqa: E731
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        run()  # compile outside the capture
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        static_y = run()
    for seed in (1, 2):
        static_x.copy_(torch.randn(x.shape, generator=torch.Generator().manual_seed(seed)).cuda())
        graph.replay()
        assert torch.equal(static_y, fp8_linear(static_x, weight, scale, FORMATS["block128"]))


# the tiny GLM-5-FP8's q_a and kv_a stay apart: their block scales would straddle one stacked weight
@pytest.mark.parametrize(("variant", "dense_fp8"), [
    ("glm4_moe_fp8", ("qkv",)), ("glm_moe_dsa_fp8", ("q_b", "latent_in_parts")),
])
def test_glm_keeps_dense_fp8_weights_fp8_on_the_gpu_and_plans_them_as_stored(variant, dense_fp8, tmp_path):
    folder = ModelFolder.open(write_tiny_glm(tmp_path, variant, mtp=False))
    gpu = load_model(folder, device="cuda", dtype="bfloat16", context=32)
    cpu = load_model(folder, device="cpu", dtype="bfloat16", context=32)
    attention = gpu.model.layers[0].attention
    weights = [getattr(attention, name) for name in dense_fp8]
    assert all(isinstance(weight, Fp8Weight) for entry in weights for weight in (
        entry if isinstance(entry, tuple) else (entry,)))
    assert gpu.facts.fp8_kept and not cpu.facts.fp8_kept
    assert gpu.placement.resident_bytes < cpu.placement.resident_bytes
