"""The GPU paths (copy stream, slot table, CUDA graph, Triton experts) against the CPU engine.
Skipped without a CUDA device; run on the GPU machine with `python -m pytest tests/engine/test_cuda.py`."""

import pytest
import torch

from app.engine.generation.generate import generate
from app.engine.generation.sampling import Sampler, SamplingParams
from app.engine.loader import load_model
from app.engine.runner.step_runner import StepRunner
from app.engine.session import collect
from app.model_folder import ModelFolder
from tests.engine.greedy import greedy_with_stats

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")

PROMPT = list(range(40, 60))


def greedy(loaded, count: int) -> tuple[list[int], dict]:
    return greedy_with_stats(loaded, PROMPT, count)


def load(folder, device: str, **options):
    return load_model(ModelFolder.open(folder), device=device, dtype="float32", context=64, **options)


def test_gpu_greedy_tokens_match_the_cpu_engine(tiny_gpt_oss):
    cpu_tokens, _ = greedy(load(tiny_gpt_oss, "cpu"), 24)
    gpu = load(tiny_gpt_oss, "cuda")
    assert gpu.model.experts.complete  # the CUDA-graph path
    gpu_tokens, stats = greedy(gpu, 24)
    assert gpu_tokens == cpu_tokens
    assert stats.expert_cache.misses == 0
    assert stats.expert_cache.hits > 0  # counted on the device, read once at the end


def test_host_experts_are_page_locked_in_one_allocation(tiny_gpt_oss):
    placement = load(tiny_gpt_oss, "cuda").placement
    budget = placement.resident_bytes + placement.kv_cache_bytes + placement.workspace_bytes
    store = load(tiny_gpt_oss, "cuda", gpu_budget=budget + 5 * placement.expert_bytes).model.experts.store
    assert store.host.buffer.is_pinned()
    assert all(t.is_pinned() for t in store.expert(store.layers[-1], 0).values())


def test_offloaded_gpu_experts_with_prefetch_match_the_resident_graph(tiny_gpt_oss):
    resident_tokens, _ = greedy(load(tiny_gpt_oss, "cuda"), 24)
    resident = load(tiny_gpt_oss, "cuda")
    placement = resident.placement
    budget = placement.resident_bytes + placement.kv_cache_bytes + placement.workspace_bytes
    offloaded = load(tiny_gpt_oss, "cuda", gpu_budget=budget + 5 * placement.expert_bytes, prefetch_layers=2,
                     misses_on_device=False)
    assert not offloaded.model.experts.complete
    tokens, stats = greedy(offloaded, 24)
    assert tokens == resident_tokens
    assert stats.expert_cache.misses > 0
    assert stats.expert_cache.prefetches > 0


def test_first_logits_match_the_cpu_engine(tiny_gpt_oss):
    ids = torch.tensor(PROMPT)
    with torch.inference_mode():
        cpu_model, gpu_model = load(tiny_gpt_oss, "cpu").model, load(tiny_gpt_oss, "cuda").model
        expected = cpu_model.forward(ids, cpu_model.new_kv_cache(64))
        got = gpu_model.forward(ids.cuda(), gpu_model.new_kv_cache(64)).cpu()
    assert (got - expected).abs().max() <= 1e-2 * expected.abs().max()


def test_bf16_graph_decode_matches_the_eager_forward(tiny_gpt_oss):
    """The decode graph (fused layer kernels, single-token expert op) replays exactly what eager passes compute."""
    loaded = load_model(ModelFolder.open(tiny_gpt_oss), device="cuda", dtype="bfloat16", context=64)
    graph_tokens, _ = greedy_with_stats(loaded, PROMPT, 16)
    model = loaded.model
    cache = model.new_kv_cache(64)
    with torch.inference_mode():
        logits = model.forward(torch.tensor(PROMPT, device="cuda"), cache, last_only=True)
        eager_tokens = []
        for _ in range(16):
            eager_tokens.append(int(logits[-1].argmax()))
            logits = model.forward(torch.tensor(eager_tokens[-1:], device="cuda"), cache)
    assert graph_tokens == eager_tokens


@pytest.mark.parametrize("sampling", [SamplingParams(), SamplingParams(temperature=0.8, seed=5)],
                         ids=["greedy", "seeded"])
def test_graph_passes_run_ahead_give_the_answer_of_steps_in_turn(tiny_gpt_oss, sampling):
    """The decode graph replayed one pass ahead of the host (generation/ahead.py), a stop token included."""
    model = load(tiny_gpt_oss, "cuda").model

    def answer(stop_ids: list[int], run_ahead: bool = True) -> tuple[tuple, int]:
        runner = StepRunner(model, 64, run_ahead)
        out = collect(generate(runner, PROMPT, Sampler(sampling, model.device), 24, stop_ids))
        return (out["token_ids"], out["stop_reason"], out["stats"]["expert_cache"]), runner.cache.length

    ahead, _ = answer([])
    tokens = ahead[0]
    stop = next(token for i, token in enumerate(tokens) if i >= 4 and token not in tokens[:i])
    stopped = answer([stop])
    assert answer([], run_ahead=False) == (ahead, len(PROMPT) + 23)
    assert answer([stop], run_ahead=False) == stopped
    assert stopped[1] == len(PROMPT) + len(stopped[0][0]) - 1
