"""Expert parallel on CPU: several caches with their own arenas stand for several GPUs; the output must
be the single-device engine's, with the experts spread over the devices and offloaded."""

import json
from collections import Counter

import pytest
import torch

from app.cli import main
from app.engine.experts.cache import ExpertCache
from app.engine.experts.expert_parallel import ExpertParallelCache, assign_owners
from app.engine.experts.store import OTHER_DEVICE, ExpertStore
from app.engine.loader import load_model
from app.engine.models.dflash import open_dflash
from app.model_folder import ModelFolder
from app.plan_gpus import expert_workspace
from tests.engine.greedy import greedy_with_stats
from tests.engine.test_experts import EXPERTS, LAYERS, numbered_expert

PROMPT = list(range(40, 60))
CONTEXT = 64


def load(folder, context: int = CONTEXT, dtype: str = "float32", **options):
    return load_model(ModelFolder.open(folder), dtype=dtype, context=context, **options)


def budgets_for_slots(single, slots: tuple[int, ...]) -> tuple[int, ...]:
    """Per-device budgets giving these slots: the first device also holds the dense layers."""
    p = single.placement
    workspace = expert_workspace(single.facts, p.context, single.model.dtype.itemsize)
    first = p.resident_bytes + p.kv_cache_bytes + p.workspace_bytes + slots[0] * p.expert_bytes
    return first, *(workspace + count * p.expert_bytes for count in slots[1:])


def test_owners_follow_the_slots_and_interleave_within_every_layer():
    owners = assign_owners((0, 1, 2), 8, (3, 1))
    per_layer = Counter((layer, device) for (layer, _), device in owners.items())
    assert [per_layer[(layer, 0)] for layer in (0, 1, 2)] == [6, 6, 6]  # 3 : 1 in every layer
    assert [owners[(0, e)] for e in range(4)] == [0, 0, 0, 1]
    exact = Counter(assign_owners((0, 1), 8, (11, 5)).values())
    assert exact == {0: 11, 1: 5}  # slots for every expert: each device owns exactly its slots


def test_a_cache_gives_other_devices_picks_no_slot_no_copy_and_no_count():
    store = ExpertStore(numbered_expert, LAYERS, EXPERTS, host_experts=8, pin=False)
    cache = ExpertCache(store, 2, torch.device("cpu"))
    top_experts = torch.tensor([[1, OTHER_DEVICE], [OTHER_DEVICE, OTHER_DEVICE]])
    seen = {}

    def op(hidden, arenas, slots, weights):
        seen["slots"] = slots.clone()
        return torch.zeros_like(hidden)

    cache.run(1, torch.ones(2, 3), top_experts, torch.ones(2, 2), op, {0: torch.tensor([[2, OTHER_DEVICE]])})
    assert cache.resident() == {(1, 1), (0, 2)}  # the pick and the prediction, nothing for OTHER_DEVICE
    assert seen["slots"][0, 1] == -1 and (seen["slots"][1] == -1).all() and seen["slots"][0, 0] >= 0
    assert (cache.stats.misses, cache.stats.prefetches) == (1, 1)


def test_offloaded_experts_spread_over_two_devices_give_the_single_device_tokens(tiny_gpt_oss):
    single = load(tiny_gpt_oss)
    expected, single_stats = greedy_with_stats(single, PROMPT, 16)
    spread = load(tiny_gpt_oss, gpu_budget=budgets_for_slots(single, (3, 4)), prefetch_layers=1)
    experts = spread.model.experts
    assert isinstance(experts, ExpertParallelCache)
    assert [p.expert_slots for p in spread.gpu_placements] == [3, 4] and spread.placement.expert_slots == 7
    tokens, stats = greedy_with_stats(spread, PROMPT, 16)
    assert tokens == expected
    for index, shard in enumerate(experts.shards):
        assert shard.stats.misses > 0  # both devices fetched and ran experts
        assert shard.resident() <= set(experts.owned(index))
        assert len(shard.resident()) <= shard.num_slots
    totals = stats.expert_cache
    assert totals.misses == sum(shard.stats.misses for shard in experts.shards)
    assert totals.prefetches > 0 and 0 < totals.prefetch_coverage <= 1
    # every expert a layer uses is a hit or a miss on exactly one device (all hits on the resident single one)
    assert totals.hits + totals.misses == single_stats.expert_cache.hits


def test_logits_of_three_devices_match_one(tiny_gpt_oss):
    single = load(tiny_gpt_oss)
    spread = load(tiny_gpt_oss, gpu_budget=budgets_for_slots(single, (2, 3, 4)))
    ids = torch.tensor(PROMPT)
    with torch.inference_mode():
        expected = single.model.forward(ids, single.model.new_kv_cache(CONTEXT))
        got = spread.model.forward(ids, spread.model.new_kv_cache(CONTEXT))
    assert (got - expected).abs().max() <= 1e-4 * expected.abs().max()
    assert expected.std() > 0.5


def test_devices_whose_experts_all_fit_need_no_fetch(tiny_gpt_oss):
    single = load(tiny_gpt_oss)
    expected, single_stats = greedy_with_stats(single, PROMPT, 16)
    spread = load(tiny_gpt_oss, gpu_budget=budgets_for_slots(single, (20, 20)))
    assert [p.expert_slots for p in spread.gpu_placements] == [16, 16]  # 32 experts, spread evenly
    assert all(shard.complete for shard in spread.model.experts.shards)
    tokens, stats = greedy_with_stats(spread, PROMPT, 16)
    assert tokens == expected
    assert stats.expert_cache.misses == 0
    assert stats.expert_cache.hits == single_stats.expert_cache.hits


@pytest.mark.parametrize("variant", ["glm4_moe"])
def test_glm_experts_spread_over_two_devices_give_the_single_device_tokens(tiny_glm, variant):
    folder = tiny_glm(variant)
    single = load(folder)
    expected, _ = greedy_with_stats(single, PROMPT, 16)
    spread = load(folder, gpu_budget=budgets_for_slots(single, (4, 5)), prefetch_layers=1)
    tokens, stats = greedy_with_stats(spread, PROMPT, 16)
    assert tokens == expected
    assert stats.expert_cache.misses > 0


def test_cli_generate_with_a_budget_per_device_and_a_drafter_keeps_the_tokens(tiny_gpt_oss, tiny_dflash, capsys):
    prompt = ["--prompt-ids", ",".join(map(str, PROMPT)), "--max-new-tokens", "10"]
    context = len(PROMPT) + 10
    assert main(["generate", str(tiny_gpt_oss), *prompt, "--json"]) == 0
    expected = json.loads(capsys.readouterr().out)["token_ids"]
    first, second = budgets_for_slots(load(tiny_gpt_oss, context), (3, 3))
    folder, config = open_dflash(tiny_dflash)
    first += config.device_bytes(folder, context, "float32")  # the drafter lives on the first device
    spec = ["--spec", "dflash", "--drafter", str(tiny_dflash), "--block-size", "3"]
    assert main(["generate", str(tiny_gpt_oss), *prompt, "--gpu-budget", f"{first},{second}", *spec, "--json"]) == 0
    result = json.loads(capsys.readouterr().out)
    assert result["token_ids"] == expected
    assert result["stats"]["expert_cache"]["misses"] > 0
