"""The placement over several GPUs: one budget per GPU, the dense layers on the first, slots on all."""

import json
import random
from collections import OrderedDict

import pytest

from app.cli import main
from app.errors import UserError
from app.model_folder import ModelFolder
from app.plan import Hardware, ModelFacts, expert_hit_rate, plan_placement
from app.plan_gpus import expert_workspace, plan_budgets, plan_gpus, predict_gpus, spread
from tests.fixtures.shape_only import write_shape_only_model

GIB = 1 << 30
CONTEXT = 4096


@pytest.fixture(scope="module")
def gpt_oss_20b(tmp_path_factory):
    return write_shape_only_model(tmp_path_factory.mktemp("20b"))


@pytest.fixture(scope="module")
def facts(gpt_oss_20b) -> ModelFacts:
    return ModelFacts.from_folder(ModelFolder.open(gpt_oss_20b))


def test_every_gpu_gets_the_slots_its_budget_holds_and_stays_within_it(facts):
    first, second = plan_gpus(facts, (6 * GIB, 3 * GIB), None, CONTEXT, 2)
    single = plan_placement(facts, 6 * GIB, None, CONTEXT, 2)
    assert first.expert_slots == single.expert_slots  # the first GPU is planned as a single one
    assert (first.resident_bytes, first.kv_cache_bytes) == (single.resident_bytes, single.kv_cache_bytes)
    assert second.resident_bytes == second.kv_cache_bytes == 0
    assert second.expert_slots == (3 * GIB - expert_workspace(facts, CONTEXT, 2)) // facts.expert_bytes
    assert first.device_bytes <= 6 * GIB and second.device_bytes <= 3 * GIB
    assert second.device_bytes + facts.expert_bytes > 3 * GIB  # no slot left out


def test_budgets_that_hold_more_than_every_expert_spread_them_evenly(facts):
    gpus = plan_gpus(facts, (40 * GIB, 40 * GIB), None, CONTEXT, 2)
    assert [gpu.expert_slots for gpu in gpus] == [facts.total_experts // 2] * 2
    assert spread([3, 100], 32) == [3, 29]  # a small GPU is filled, the large one takes the rest
    assert spread([17, 16, 100], 40) == [13, 13, 14]
    assert spread([5, 6], 32) == [5, 6]


def test_a_second_gpu_at_the_same_budget_doubles_the_cache_and_the_links(facts):
    budget = 8 * GIB
    one, no_gpus = plan_budgets(facts, budget, None, CONTEXT, 2)
    two, gpus = plan_budgets(facts, (budget, budget), None, CONTEXT, 2)
    assert no_gpus == () and len(gpus) == 2
    assert two.expert_slots == sum(gpu.expert_slots for gpu in gpus) > 1.9 * one.expert_slots
    single, double = (predict_gpus(facts, p, g, 2, Hardware()) for p, g in ((one, ()), (two, gpus)))
    uses = facts.expert_bytes_per_token // facts.expert_bytes
    assert double.hit_rate == expert_hit_rate(two.expert_slots, facts.total_experts, uses) > single.hit_rate
    assert double.copy_s < single.copy_s / 2  # half the misses over each of two links
    assert double.tok_s_low > single.tok_s_low


def test_lru_caches_of_owned_experts_hit_as_one_cache_of_all_their_slots():
    """The planner models the GPUs' caches as one cache of their slots: under uniform routing, per-GPU
    LRU caches over interleaved owners hit as often as one LRU cache of the same total size."""
    experts, layers, top_k, slots = 32, 24, 4, 300
    one = _lru_hit_rate(experts, layers, top_k, [slots])
    two = _lru_hit_rate(experts, layers, top_k, [slots // 2, slots // 2])
    assert two == pytest.approx(one, abs=0.02)


def _lru_hit_rate(experts: int, layers: int, top_k: int, slots: list[int], tokens: int = 500) -> float:
    rng = random.Random(0)
    caches = [OrderedDict() for _ in slots]
    hits = uses = 0
    for token in range(tokens):
        for layer in range(layers):
            for expert in rng.sample(range(experts), top_k):
                owner = (layer * experts + expert) % len(slots)
                cache, counted = caches[owner], token >= tokens // 5
                if (layer, expert) in cache:
                    cache.move_to_end((layer, expert))
                    hits += counted
                else:
                    cache[(layer, expert)] = None
                    if len(cache) > slots[owner]:
                        cache.popitem(last=False)
                uses += counted
    return hits / uses


def test_a_budget_too_small_names_the_gpu(facts):
    with pytest.raises(UserError, match=r"GPU 1: budget 100\.00 MiB is too small"):
        plan_gpus(facts, (8 * GIB, 100 << 20), None, CONTEXT, 2)
    with pytest.raises(UserError, match=r"GPU 0: GPU budget 1\.00 GiB is too small"):
        plan_gpus(facts, (GIB, 8 * GIB), None, CONTEXT, 2)


def test_cli_plan_shows_every_gpu(gpt_oss_20b, facts, capsys):
    assert main(["plan", str(gpt_oss_20b), "--gpu-budget", "8G,6G", "--ram-budget", "16G", "--device", "cuda",
                 "--json"]) == 0
    planned = json.loads(capsys.readouterr().out)
    gpus = plan_gpus(facts, (8 * GIB, 6 * GIB), 16 * GIB, CONTEXT, 2)
    assert planned["gpus"] == [{"expert_slots": g.expert_slots, "device_bytes": g.device_bytes} for g in gpus]
    assert planned["expert_slots"] == sum(g.expert_slots for g in gpus)
    assert main(["plan", str(gpt_oss_20b), "--gpu-budget", "8G,6G", "--ram-budget", "16G", "--device", "cuda"]) == 0
    text = capsys.readouterr().out
    assert f"GPU 1: {gpus[1].expert_slots} expert slots" in text
    assert main(["plan", str(gpt_oss_20b), "--gpu-budget", "8G,50M", "--ram-budget", "16G", "--device", "cuda"]) == 1
    assert "moechat: error: GPU 1: budget" in capsys.readouterr().err
