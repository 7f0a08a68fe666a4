"""The GLM models on a GPU (resident experts, offloaded experts with prefetch, FP8 dequantized on the
device) against the CPU engine. Skipped without a CUDA device; run on the GPU machine with
`python -m pytest tests/engine/test_glm_cuda.py`."""

import pytest
import torch

from app.engine.loader import load_model
from app.kernels import fp8_bytes
from app.model_folder import ModelFolder
from tests.engine.greedy import greedy_with_stats
from tests.fixtures.tiny_glm import VARIANTS

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")

PROMPT = list(range(40, 60))


def greedy(loaded, count: int) -> tuple[list[int], dict]:
    return greedy_with_stats(loaded, PROMPT, count)


def load(folder, device: str, dtype: str = "float32", **options):
    return load_model(ModelFolder.open(folder), device=device, dtype=dtype, context=64, **options)


@pytest.mark.parametrize("variant", VARIANTS)
def test_gpu_greedy_tokens_match_the_cpu_engine(variant, tiny_glm):
    cpu_tokens, _ = greedy(load(tiny_glm(variant), "cpu"), 24)
    gpu = load(tiny_glm(variant), "cuda")
    assert gpu.model.experts.complete
    gpu_tokens, stats = greedy(gpu, 24)
    assert gpu_tokens == cpu_tokens
    assert stats.expert_cache.misses == 0


@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("on_device", [False, True], ids=["copied-with-prefetch", "served-on-device"])
def test_offloaded_gpu_experts_match_the_resident_ones(variant, tiny_glm, on_device):
    resident = load(tiny_glm(variant), "cuda")
    resident_tokens, _ = greedy(resident, 24)
    placement = resident.placement
    budget = placement.resident_bytes + placement.kv_cache_bytes + placement.workspace_bytes
    offloaded = load(tiny_glm(variant), "cuda", gpu_budget=budget + 5 * placement.expert_bytes, prefetch_layers=2,
                     misses_on_device=on_device)
    assert not offloaded.model.experts.complete and (offloaded.model.experts.device_misses is not None) == on_device
    tokens, stats = greedy(offloaded, 24)
    assert tokens == resident_tokens
    assert stats.expert_cache.misses > 0
    assert (stats.expert_cache.prefetches > 0) != on_device  # served on the device, nothing is prefetched


@pytest.mark.parametrize("variant", VARIANTS)
def test_bfloat16_logits_stay_close_to_float32(variant, tiny_glm, monkeypatch):
    """DSA's top-k is discrete: bf16 rounding may keep other tokens once a query has more than index_topk,
    so for GLM-5 only the positions where the indexer keeps everything are compared. FP8 products, which quantize
    a prompt's x (below), are off: x keeps its 16 bits, as on GPUs before sm_89."""
    monkeypatch.setenv(fp8_bytes.FORCE, "1")
    ids = torch.tensor(PROMPT, device="cuda")
    with torch.inference_mode():
        exact, half = load(tiny_glm(variant), "cuda").model, load(tiny_glm(variant), "cuda", "bfloat16").model
        expected = exact.forward(ids, exact.new_kv_cache(64))
        got = half.forward(ids, half.new_kv_cache(64))
    positions = getattr(exact.config, "index_topk", len(PROMPT))
    assert (got - expected)[:positions].abs().max() <= 0.1 * expected.abs().max()


@pytest.mark.parametrize("variant", [variant for variant, (_, _, fp8) in VARIANTS.items() if fp8])
def test_a_prompt_on_fp8_products_stays_near_its_16_bit_inputs(variant, tiny_glm, monkeypatch):
    """A prompt's FP8 products take x quantized to e4m3 as the checkpoint declares (fp8_products_triton.py): its
    bf16 logits against the same model's with x kept at 16 bits (FP8 products off). e4m3 keeps 4 significant bits,
    so each product moves by about 3 % of its size, and the layers add up; GLM-5's positions past index_topk are
    left out, as in the bf16 test above."""
    if fp8_bytes.reads_fp8_as_bytes(torch.device("cuda")):
        pytest.skip("no FP8 tensor cores (before sm_89)")
    ids = torch.tensor(PROMPT, device="cuda")
    with torch.inference_mode():
        quantized = load(tiny_glm(variant), "cuda", "bfloat16").model
        got = quantized.forward(ids, quantized.new_kv_cache(64)).float()
        monkeypatch.setenv(fp8_bytes.FORCE, "1")
        sixteen_bit = load(tiny_glm(variant), "cuda", "bfloat16").model
        expected = sixteen_bit.forward(ids, sixteen_bit.new_kv_cache(64)).float()
    positions = getattr(quantized.config, "index_topk", len(PROMPT))
    error = ((got - expected)[:positions].norm() / expected[:positions].norm()).item()
    assert 0 < error < 0.25, error  # 0: the prompt did not take the FP8 products


@pytest.mark.parametrize("variant", VARIANTS)
def test_the_shared_expert_as_a_routed_pick_gives_the_logits_of_its_own_mlp(variant, tiny_glm):
    """Resident experts (FP8 or 16-bit) at one token: the shared expert runs as one more pick of the routed experts'
    launches (glu_experts_one_token.py), against the same model with it in its own two products. 16-bit experts are
    stored in bf16, so the model runs in bf16 for its shared expert to share their format, and rounds its own MLP's
    output apart."""
    sixteen_bit = VARIANTS[variant][2] is None
    model = load(tiny_glm(variant), "cuda", "bfloat16" if sixteen_bit else "float32").model
    moes = list(model.moe_layers.values())
    rows = [moe.shared_row for moe in moes]
    assert all(row is not None for row in rows)
    token = torch.tensor([PROMPT[-1]], device="cuda")

    def logits_of_a_decode_step(shared_rows) -> torch.Tensor:
        for moe, row in zip(moes, shared_rows, strict=True):
            moe.shared_row = row
        cache = model.new_kv_cache(64)
        model.forward(torch.tensor(PROMPT, device="cuda"), cache)  # a prompt's tokens: the shared MLP apart
        return model.forward(token, cache)

    with torch.inference_mode():
        assert moes[0].routing(torch.randn(1, model.config.hidden_size, device="cuda")).shared is rows[0]
        together = logits_of_a_decode_step(rows)
        apart = logits_of_a_decode_step([None] * len(moes))
    assert (together - apart).abs().max() <= (2e-2 if sixteen_bit else 1e-4) * apart.abs().max()
