"""Expert parallel on real GPUs: two GPUs give what one gives. Skipped without two CUDA devices; run on
the GPU machine with `python -m pytest tests/engine/test_expert_parallel_cuda.py`."""

import pytest
import torch

from app.engine.experts.expert_parallel import ExpertParallelCache
from tests.engine.greedy import greedy_with_stats
from tests.engine.test_cuda import PROMPT
from tests.engine.test_expert_parallel import CONTEXT, budgets_for_slots, load

pytestmark = pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs two CUDA GPUs")


def test_offloaded_experts_on_two_gpus_give_the_one_gpu_tokens(tiny_gpt_oss):
    one = load(tiny_gpt_oss, device="cuda")
    expected, _ = greedy_with_stats(one, PROMPT, 24)
    two = load(tiny_gpt_oss, device="cuda", gpu_budget=budgets_for_slots(one, (3, 4)), prefetch_layers=1)
    experts = two.model.experts
    assert isinstance(experts, ExpertParallelCache)
    assert [shard.arenas["down_proj_blocks"].device for shard in experts.shards] == \
        [torch.device("cuda", 0), torch.device("cuda", 1)]
    tokens, stats = greedy_with_stats(two, PROMPT, 24)
    assert tokens == expected
    assert all(shard.stats.misses > 0 for shard in experts.shards)  # both GPUs fetched over their links
    assert stats.expert_cache.prefetches > 0


def test_experts_resident_on_two_gpus_give_the_one_gpu_tokens(tiny_gpt_oss):
    one = load(tiny_gpt_oss, device="cuda")
    expected, _ = greedy_with_stats(one, PROMPT, 24)
    two = load(tiny_gpt_oss, device="cuda", gpu_budget=budgets_for_slots(one, (16, 16)))
    assert all(shard.complete for shard in two.model.experts.shards)
    tokens, stats = greedy_with_stats(two, PROMPT, 24)
    assert tokens == expected
    assert stats.expert_cache.misses == 0


def test_bf16_logits_of_two_gpus_match_one(tiny_gpt_oss):
    one = load(tiny_gpt_oss, device="cuda", dtype="bfloat16")
    two = load(tiny_gpt_oss, device="cuda", dtype="bfloat16", gpu_budget=budgets_for_slots(one, (5, 5)))
    ids = torch.tensor(PROMPT, device="cuda")
    with torch.inference_mode():
        expected = one.model.forward(ids, one.model.new_kv_cache(CONTEXT))
        got = two.model.forward(ids, two.model.new_kv_cache(CONTEXT))
    assert (got - expected).abs().max() <= 2e-2 * expected.abs().max()
    assert (got.argmax(-1) == expected.argmax(-1)).float().mean() >= 0.9
