"""The CPU expert tier on a GPU (experts/cpu_tier.py, kernels/cpu_share.py): the hand-over through page-locked
memory inside the decode step's CUDA graph gives the tokens of the step without it, and the CPU computes part of the
misses: gpt-oss's MXFP4 experts and GLM's FP8 ones (a scale per row, and per block). Skipped without a CUDA device;
on the GPU machine: `python -m pytest tests/engine/test_cpu_tier_cuda.py`."""

import pytest
import torch

from app.engine.runner.cuda_graph import DecodeGraph
from app.engine.runner.step_runner import StepRunner
from app.kernels.cpu import library
from app.kernels.cpu_share import DONE
from tests.engine.greedy import greedy_with_stats
from tests.engine.test_device_misses_cuda import NEW, PROMPT, offloaded

pytestmark = [pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
              pytest.mark.skipif(library.library() is None, reason="the CPU kernels are not built")]


@pytest.fixture(params=["gpt_oss", "glm4_moe_fp8", "glm_moe_dsa_fp8"])
def model(request, tiny_gpt_oss, tiny_glm):
    return tiny_gpt_oss if request.param == "gpt_oss" else tiny_glm(request.param)


@pytest.mark.parametrize("threads", [1, 4])
def test_graph_steps_with_the_cpu_tier_give_the_tokens_of_steps_without_it(model, threads):
    with_tier = offloaded(model, 5, cpu_threads=threads, probe_on="cuda")  # a CPU probe left GLM resident
    tier = with_tier.model.experts.device_misses.cpu_tier
    assert tier is not None and tier.threads == threads and tier.pair_s > 0 and tier.fetch_s > 0
    tier.buffers.costs.copy_(torch.tensor([1.0, 0.0, 1.0]))  # about half of each call's misses on the CPU
    with torch.inference_mode():
        assert isinstance(StepRunner(with_tier.model, 64).program(1), DecodeGraph)
    tokens, stats = greedy_with_stats(with_tier, PROMPT, NEW)
    expected, _ = greedy_with_stats(offloaded(model, 5, probe_on="cuda"), PROMPT, NEW)
    assert tokens == expected
    work = stats.expert_cache
    assert 0 < work.cpu_computed < work.misses
    assert work.bytes_fetched == (work.misses - work.cpu_computed) * with_tier.facts.expert_bytes
    assert int(tier.buffers.control[DONE]) == int(tier.buffers.ticket) and int(tier.buffers.failed) == 0
    tier.close()

