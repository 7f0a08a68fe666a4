"""Speculation on the GPU paths (the per-block-size CUDA graphs with captured features, the copy stream
with route-ahead prefetch) against plain greedy decoding on the same device. Skipped without a CUDA
device; on the GPU machine: `python -m pytest tests/engine/spec/test_spec_cuda.py`."""

import pytest
import torch

from app.engine.generation.generate import generate
from app.engine.generation.sampling import Sampler, SamplingParams
from app.engine.loader import load_model
from app.engine.runner.step_runner import StepRunner
from app.engine.spec.dflash import DFlashProposer, DFlashSpeculation
from app.engine.spec.generate import speculative_generate
from app.model_folder import ModelFolder
from app.protocol.events import Done, Tokens
from tests.fixtures.agreeing_drafter import AgreeingDrafter

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")

PROMPT = list(range(40, 60))
NEW = 32


def load(folder, **options):
    return load_model(ModelFolder.open(folder), device="cuda", dtype="float32", context=64, **options).model


def tokens_and_stats(events) -> tuple[list[int], dict]:
    events = list(events)
    assert isinstance(events[-1], Done)
    return [t for e in events if isinstance(e, Tokens) for t in e.token_ids], events[-1].stats


@pytest.mark.parametrize("block_size", [None, 4])
@pytest.mark.parametrize("offloaded", [None, "host", "device"], ids=["resident-graph", "offloaded-prefetch",
                                                                    "offloaded-device-graphs"])
def test_gpu_speculation_emits_the_plain_greedy_tokens(tiny_gpt_oss, tiny_dflash, block_size, offloaded):
    resident = load(tiny_gpt_oss)
    assert resident.experts.complete
    reference, _ = tokens_and_stats(generate(StepRunner(resident, 64), PROMPT,
                                             Sampler(SamplingParams(), resident.device), NEW, []))
    model = resident
    if offloaded:
        probe = load_model(ModelFolder.open(tiny_gpt_oss), dtype="float32", context=64).placement
        budget = probe.resident_bytes + probe.kv_cache_bytes + probe.workspace_bytes + 5 * probe.expert_bytes
        model = load(tiny_gpt_oss, gpu_budget=budget, prefetch_layers=2,
                     misses_on_device=offloaded == "device")
        assert not model.experts.complete and (model.experts.device_misses is not None) == (offloaded == "device")
    speculation = DFlashSpeculation(tiny_dflash, None)
    speculation.load(model)
    drafter = AgreeingDrafter(speculation.new_drafter(64), len(PROMPT), reference, 0.7, 384, seed=1)
    tokens, stats = tokens_and_stats(speculative_generate(StepRunner(model, 64), PROMPT,
                                                          Sampler(SamplingParams(), model.device), NEW, [],
                                                          drafter, block_size))
    assert tokens == reference
    assert max(stats.spec.accepted_per_step) > 0
    if offloaded:
        # with misses served on the device, the look-ahead is off: it never prefetches
        assert stats.expert_cache.misses > 0
        assert (stats.expert_cache.prefetches > 0) == (offloaded == "host")
    elif block_size is None:
        assert 1 in stats.spec.block_sizes  # the graph step ran


def test_a_plain_streaks_context_goes_through_the_graphs_a_block_at_a_time(tiny_gpt_oss, tiny_dflash):
    """More committed rows than a block (a plain streak's) go through the context graphs a block's worth at a time,
    and the drafts after them are those of one eager context pass."""
    model = load(tiny_gpt_oss)
    speculation = DFlashSpeculation(tiny_dflash, None)
    speculation.load(model)
    graphed = speculation.new_drafter(64)
    eager = DFlashProposer(speculation.drafter, speculation.drafter.new_context_cache(64))
    replays = []
    for size, graph in graphed.graphs.contexts.items():
        graphed.graphs.contexts[size] = lambda rows, graph=graph: replays.append(len(rows)) or graph(rows)
    width = len(graphed.target_layers) * speculation.drafter.config.hidden_size
    features = torch.randn(2 * graphed.block_size + 1, width, device=model.device)
    sampler = Sampler(SamplingParams(), model.device)
    drafts = []
    for proposer in (graphed, eager):
        for row in features:
            proposer.commit([0], row[None])
        drafts.append(proposer.propose(PROMPT[0], graphed.block_size - 1, sampler).tokens)
    assert replays == [graphed.block_size, graphed.block_size, 1]
    assert drafts[0] == drafts[1]
