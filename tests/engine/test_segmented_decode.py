"""The segmented decode step (segmented_decode.py) against the eager forward with experts offloaded: same
greedy tokens, logits within float32 rounding (attention spans the whole cache, masked, instead of the
committed rows), the same expert-cache work, for GPT-OSS and every GLM variant (dense first layers run
inside a segment, FP8, MLA, DSA). On CPU the segments run as plain code; on a GPU (skipped without one:
`python -m pytest tests/engine/test_segmented_decode.py`) each is a replayed CUDA graph."""

import pytest
import torch

from app.engine.generation.sampling import Sampler, SamplingParams
from app.engine.loader import load_model
from app.engine.runner.segmented_decode import SegmentedDecode, segments_ready
from app.engine.runner.step_runner import StepRunner, prefill
from app.engine.spec.dflash import DFlashSpeculation
from app.engine.spec.generate import speculative_generate
from app.engine.spec.mtp import MtpSpeculation
from app.engine.spec.step import Speculator
from app.model_folder import ModelFolder
from app.protocol.events import Tokens
from app.protocol.stats import CacheStats
from tests.engine.greedy import greedy_with_stats

PROMPT = list(range(40, 60))  # longer than the tiny model's sliding window of 8
NEW = 24
needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
GLM_VARIANTS = ["glm4_moe", "glm4_moe_fp8", "glm4_moe_lite", "glm_moe_dsa", "glm_moe_dsa_fp8"]


@pytest.fixture
def checkpoint(tiny_gpt_oss, tiny_glm):
    """model name ("gpt_oss" or a GLM variant) -> its tiny checkpoint."""
    return lambda name: tiny_gpt_oss if name == "gpt_oss" else tiny_glm(name)


def offloaded(folder, device: str, slots: int, prefetch_layers: int = 0):
    probe = load_model(ModelFolder.open(folder), device=device, dtype="float32", context=64).placement
    budget = probe.resident_bytes + probe.kv_cache_bytes + probe.workspace_bytes + slots * probe.expert_bytes
    loaded = load_model(ModelFolder.open(folder), device=device, dtype="float32", context=64, gpu_budget=budget,
                        prefetch_layers=prefetch_layers, misses_on_device=False)
    assert loaded.placement.expert_slots == slots and not loaded.model.experts.complete
    return loaded


def eager_step(model, cache):
    return lambda token: model.forward(torch.tensor([token], device=model.device), cache)[-1]


def segmented_step(model, cache):
    return SegmentedDecode(model, cache).step


def greedy_decode(loaded, make_step) -> tuple[list[int], torch.Tensor, CacheStats]:
    """NEW greedy tokens after PROMPT, the logits [NEW, V] of the decode steps that produced all but the
    first, and the expert cache's work over prefill and decode. The step is made before the prefill, as
    generate does."""
    model = loaded.model
    cache = model.new_kv_cache(len(PROMPT) + NEW)
    before = model.experts.snapshot()
    with torch.inference_mode():
        step = make_step(model, cache)
        logits = prefill(model, cache, PROMPT)
        tokens, step_logits = [], []
        for _ in range(NEW):
            tokens.append(int(logits.argmax()))
            logits = step(tokens[-1])
            step_logits.append(logits.cpu().clone())
    return tokens, torch.stack(step_logits), model.experts.snapshot().since(before)


def assert_same_decode(eager, segmented) -> None:
    (tokens, logits, work), (expected_tokens, expected_logits, expected_work) = segmented, eager
    assert tokens == expected_tokens
    assert len(set(tokens)) > 4  # a degenerate repeat would prove little
    assert (logits - expected_logits).abs().max() <= 1e-4 * expected_logits.abs().max()
    assert work == expected_work
    assert work.misses > NEW and work.evictions > 0  # the cache is too small for the routing: it evicts


@pytest.mark.parametrize("prefetch_layers", [0, 1])
def test_segments_run_on_cpu_give_the_eager_tokens_and_cache_work(tiny_gpt_oss, prefetch_layers):
    eager = greedy_decode(offloaded(tiny_gpt_oss, "cpu", 3, prefetch_layers), eager_step)
    segmented = greedy_decode(offloaded(tiny_gpt_oss, "cpu", 3, prefetch_layers), segmented_step)
    assert_same_decode(eager, segmented)
    assert (segmented[2].prefetches > 0) == (prefetch_layers > 0)


@pytest.mark.parametrize("variant", GLM_VARIANTS)
def test_glm_segments_run_on_cpu_give_the_eager_tokens_and_cache_work(tiny_glm, variant):
    eager = greedy_decode(offloaded(tiny_glm(variant), "cpu", 3, prefetch_layers=1), eager_step)
    segmented_model = offloaded(tiny_glm(variant), "cpu", 3, prefetch_layers=1)
    segmented = greedy_decode(segmented_model, segmented_step)
    assert_same_decode(eager, segmented)
    assert segmented[2].prefetches > 0
    with torch.inference_mode():
        segments = SegmentedDecode(segmented_model.model, segmented_model.model.new_kv_cache(8))
    assert len(segments.replays) == len(segments.expert_layers) + 1 < segmented_model.model.config.num_hidden_layers + 1


# (model, captured layers): GPT-OSS's layer 3 is its last; GLM's MTP drafter reads the last layer (2), and the
# tiny GLM-5.2's layer 0 is dense (captured inside the first segment), its layer 1 the first with experts
CAPTURES = [("gpt_oss", (0, 2, 3)), ("glm4_moe", (2,)), ("glm_moe_dsa", (0, 1, 3))]


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=needs_cuda)])
@pytest.mark.parametrize(("name", "layers"), CAPTURES, ids=[name for name, _ in CAPTURES])
def test_segments_capture_the_features_the_eager_forward_captures(checkpoint, name, layers, device):
    model = offloaded(checkpoint(name), device, 3).model
    eager_cache, cache = model.new_kv_cache(32), model.new_kv_cache(32)
    with torch.inference_mode():
        step = SegmentedDecode(model, cache, capture=layers)
        for each in (eager_cache, cache):
            model.forward(torch.tensor(PROMPT[:-1], device=device), each)
        expected_logits, expected = model.forward(torch.tensor(PROMPT[-1:], device=device), eager_cache,
                                                  capture=layers)
        logits = step.run(PROMPT[-1:])
    assert cache.length == eager_cache.length == len(PROMPT)
    assert step.features.shape == expected.shape == (1, len(layers) * model.config.hidden_size)
    assert (step.features - expected).abs().max() <= 1e-4 * expected.abs().max()
    assert (logits - expected_logits).abs().max() <= 1e-4 * expected_logits.abs().max()


@needs_cuda
@pytest.mark.parametrize("prefetch_layers", [0, 2])
@pytest.mark.parametrize("name", ["gpt_oss", *GLM_VARIANTS])
def test_gpu_segment_graphs_give_the_eager_tokens_and_cache_work(checkpoint, name, prefetch_layers):
    eager = greedy_decode(offloaded(checkpoint(name), "cuda", 5, prefetch_layers), eager_step)
    segmented = greedy_decode(offloaded(checkpoint(name), "cuda", 5, prefetch_layers), segmented_step)
    assert_same_decode(eager, segmented)


@needs_cuda
@pytest.mark.parametrize("name", ["gpt_oss", "glm4_moe", "glm_moe_dsa"])
def test_generate_decodes_offloaded_experts_with_segment_graphs(checkpoint, name):
    loaded = offloaded(checkpoint(name), "cuda", 5)
    assert segments_ready(loaded.model)
    with torch.inference_mode():
        assert isinstance(StepRunner(loaded.model, 64).program(1), SegmentedDecode)
    eager_tokens, _, eager_work = greedy_decode(offloaded(checkpoint(name), "cuda", 5), eager_step)
    tokens, stats = greedy_with_stats(loaded, PROMPT, NEW + 1)  # NEW decode steps, as greedy_decode runs
    assert tokens[:-1] == eager_tokens
    assert stats.expert_cache == eager_work


@needs_cuda
def test_plain_speculative_steps_replay_segment_graphs_and_keep_the_tokens(tiny_gpt_oss, tiny_dflash):
    eager_tokens, _, _ = greedy_decode(offloaded(tiny_gpt_oss, "cuda", 5), eager_step)
    model = offloaded(tiny_gpt_oss, "cuda", 5).model
    speculation = DFlashSpeculation(tiny_dflash, None)
    speculation.load(model)
    sampler = Sampler(SamplingParams(), model.device)
    runner = StepRunner(model, 64)
    with torch.inference_mode():
        programs = Speculator(runner, speculation.new_drafter(64), sampler).runner.programs
    assert list(programs) == [(1, speculation.drafter.config.target_layer_ids)]
    assert isinstance(next(iter(programs.values())), SegmentedDecode)
    events = list(speculative_generate(runner, PROMPT, sampler, NEW, [], speculation.new_drafter(64), block_size=1))
    assert [t for event in events if isinstance(event, Tokens) for t in event.token_ids] == eager_tokens


@needs_cuda
@pytest.mark.parametrize("variant", ["glm4_moe", "glm_moe_dsa"])
def test_plain_mtp_steps_replay_segment_graphs_that_capture_the_last_layer(tiny_glm, variant):
    eager_tokens, _, _ = greedy_decode(offloaded(tiny_glm(variant), "cuda", 5), eager_step)
    loaded = offloaded(tiny_glm(variant), "cuda", 5)
    model = loaded.model
    speculation = MtpSpeculation(loaded.facts, None)
    speculation.load(model)
    sampler = Sampler(SamplingParams(), model.device)
    runner = StepRunner(model, 64)
    with torch.inference_mode():
        programs = Speculator(runner, speculation.new_drafter(64), sampler).runner.programs
    assert list(programs) == [(1, (model.config.num_hidden_layers - 1,))]
    assert isinstance(next(iter(programs.values())), SegmentedDecode)
    for block_size in (1, None):  # plain steps only; the cost-aware policy's mix of plain and verify steps
        events = list(speculative_generate(runner, PROMPT, sampler, NEW, [], speculation.new_drafter(64),
                                           block_size=block_size))
        assert [t for event in events if isinstance(event, Tokens) for t in event.token_ids] == eager_tokens
