"""The CPU expert tier in the decode-speed model: its split of a layer's misses against the engine's, its rates
against the measurements they come from, and where it changes nothing."""

from dataclasses import replace
from itertools import pairwise, product

import pytest

from app.plan import FETCH_SHARE_OF_LINK, ModelFacts, predict_decode
from app.plan_cpu import CPU_HARDWARE
from app.plan_cpu_tier import HOST_CPU_EXPERTS, cpu_count, cpu_tier_idle, expected_share, miss_s
from app.plan_gpus import plan_budgets, predict_gpus
from tests.test_plan_performance import H200_MEASURED_RATES, placement_with_slots

SHARES = (0.1, 0.25, 0.5, 0.75)


@pytest.fixture(scope="module")
def gpt_oss_20b(tmp_path_factory):
    from app.model_folder import ModelFolder
    from tests.fixtures.shape_only import write_shape_only_model

    return ModelFacts.from_folder(ModelFolder.open(write_shape_only_model(tmp_path_factory.mktemp("20b"))))


@pytest.mark.parametrize("costs", list(product((0.27e-3, 0.6e-3, 1.0), (0.0, 0.1e-3, 1.0), (0.0, 0.46e-3, 1.0))))
def test_the_planners_split_is_the_engines(costs):
    """The count the split gives the CPU, for one token (a pair per miss), is the one whose miss time is least, the
    fewest on a tie."""
    for misses in range(9):
        least = min(range(misses + 1), key=lambda count: miss_s(misses, count, costs))
        assert least == cpu_count(misses, misses, list(costs)), misses


def test_the_expected_share_is_the_mean_over_every_miss_pattern():
    top_k, miss_rate, costs = 4, 0.7, (0.27e-3, 0.1e-3, 0.54e-3)
    saved = computed = 0.0
    for pattern in product((False, True), repeat=top_k):
        misses = sum(pattern)
        chance = miss_rate**misses * (1 - miss_rate) ** (top_k - misses)
        count = cpu_count(misses, misses, list(costs))
        saved += chance * (misses * costs[0] - miss_s(misses, count, costs))
        computed += chance * count
    assert expected_share(top_k, miss_rate, costs) == pytest.approx((saved, computed), rel=1e-12)
    assert computed > 0


def test_the_rates_are_the_measured_ones_slowed_to_the_steps():
    rates = HOST_CPU_EXPERTS
    for threads, seconds in rates.expert_s_by_threads:
        assert rates.pair_s(threads, rates.expert_bytes) == pytest.approx(seconds * rates.step_slowdown)
    assert rates.pair_s(15, rates.expert_bytes) == pytest.approx(0.2035e-3, rel=1e-3)  # the step's
    between = (rates.bytes_per_s(8) + rates.bytes_per_s(12)) / 2  # the rate between two measured thread counts
    assert rates.bytes_per_s(10) == pytest.approx(between) and rates.bytes_per_s(8) < between
    assert rates.pair_s(64, 1 << 20) == rates.pair_s(16, 1 << 20)  # nothing measured past 16 threads
    assert rates.pair_s(1, 2 << 20) == pytest.approx(2 * rates.pair_s(1, 1 << 20))


def test_more_threads_never_predict_slower(gpt_oss_20b):
    for share, worst_case in product(SHARES, (False, True)):
        placement = placement_with_slots(gpt_oss_20b, int(share * gpt_oss_20b.total_experts))
        predictions = [predict_decode(gpt_oss_20b, placement, 2, H200_MEASURED_RATES, worst_case, threads)
                       for threads in range(0, 21)]
        for fewer, more in pairwise(predictions):
            assert more.tok_s_low >= fewer.tok_s_low and more.tok_s_high >= fewer.tok_s_high
            assert more.cpu_experts_per_token >= fewer.cpu_experts_per_token
    placement = placement_with_slots(gpt_oss_20b, gpt_oss_20b.total_experts // 10)
    off, on = (predict_decode(gpt_oss_20b, placement, 2, H200_MEASURED_RATES, True, t) for t in (0, 14))
    assert on.tok_s_low > off.tok_s_low and on.bound == "PCIe and the CPU"


def test_the_cpus_experts_are_not_fetched_and_without_threads_the_prediction_is_todays(gpt_oss_20b):
    placement = placement_with_slots(gpt_oss_20b, gpt_oss_20b.total_experts // 4)
    off = predict_decode(gpt_oss_20b, placement, 2, H200_MEASURED_RATES, cpu_threads=0)
    assert off == predict_decode(gpt_oss_20b, placement, 2, H200_MEASURED_RATES)
    assert off.cpu_experts_per_token == 0
    assert off.fetched_bytes_per_token == pytest.approx(gpt_oss_20b.expert_bytes_per_token * (1 - off.hit_rate))
    assert off.copy_s == off.fetched_bytes_per_token / (H200_MEASURED_RATES.link_bps * FETCH_SHARE_OF_LINK)
    on = predict_decode(gpt_oss_20b, placement, 2, H200_MEASURED_RATES, cpu_threads=12)
    assert on.cpu_experts_per_token > 0 and on.hit_rate == off.hit_rate
    assert on.fetched_bytes_per_token + on.cpu_experts_per_token * gpt_oss_20b.expert_bytes == \
        pytest.approx(off.fetched_bytes_per_token)
    assert on.copy_s < off.copy_s


# The H200's decode runs with the tier under uniform routing, steps in CUDA graphs, the AVX-512 tile
# (bench/results/decode-gpt-oss-20b-2026-12-02-cpu-tier-avx512.json): share of the routed experts on the GPU ->
# (threads, CPU experts a token measured)
MEASURED_CPU_EXPERTS = {0.1: (15, 47.5), 0.25: (15, 42.4)}


@pytest.mark.parametrize("share", sorted(MEASURED_CPU_EXPERTS))
def test_the_planned_split_gives_the_cpu_experts_the_h200_runs_gave(gpt_oss_20b, share):
    threads, measured = MEASURED_CPU_EXPERTS[share]
    placement = placement_with_slots(gpt_oss_20b, int(share * gpt_oss_20b.total_experts))
    planned = predict_decode(gpt_oss_20b, placement, 2, H200_MEASURED_RATES, worst_case=True, cpu_threads=threads)
    assert planned.cpu_experts_per_token == pytest.approx(measured, rel=0.15)


def test_where_the_tier_cannot_run_threads_change_nothing(gpt_oss_20b):
    half = placement_with_slots(gpt_oss_20b, gpt_oss_20b.total_experts // 2)
    on_disk = placement_with_slots(gpt_oss_20b, gpt_oss_20b.total_experts // 2, ram_budget=0)
    resident = placement_with_slots(gpt_oss_20b, gpt_oss_20b.total_experts)
    cases = {"no GPU": (half, CPU_HARDWARE), "read from disk": (on_disk, H200_MEASURED_RATES),
             "every expert is on the GPU": (resident, H200_MEASURED_RATES)}
    for words, (placement, hardware) in cases.items():
        assert words in cpu_tier_idle(gpt_oss_20b, placement, hardware)
        with_threads = predict_decode(gpt_oss_20b, placement, 2, hardware, cpu_threads=8)
        assert with_threads == predict_decode(gpt_oss_20b, placement, 2, hardware)
        assert with_threads.cpu_experts_per_token == 0
    assert cpu_tier_idle(gpt_oss_20b, half, H200_MEASURED_RATES) is None
    assert cpu_tier_idle(gpt_oss_20b, half, replace(H200_MEASURED_RATES, cpu_experts=None)) is not None
    budget = plan_budgets(gpt_oss_20b, None, None, 4096, 2)[0].device_bytes // 3
    placement, gpus = plan_budgets(gpt_oss_20b, (budget, budget), None, 4096, 2)
    assert "several GPUs" in cpu_tier_idle(gpt_oss_20b, placement, H200_MEASURED_RATES, len(gpus))
    spread = predict_gpus(gpt_oss_20b, placement, gpus, 2, H200_MEASURED_RATES, cpu_threads=8)
    assert spread == predict_gpus(gpt_oss_20b, placement, gpus, 2, H200_MEASURED_RATES)
    one_gpu, _ = plan_budgets(gpt_oss_20b, budget, None, 4096, 2)
    assert predict_gpus(gpt_oss_20b, one_gpu, (), 2, H200_MEASURED_RATES, cpu_threads=8).cpu_experts_per_token > 0


def test_without_kernels_for_the_experts_the_tier_is_idle_and_says_why(gpt_oss_20b, tiny_gpt_oss_dense, monkeypatch):
    from app import plan_cpu_tier
    from app.model_folder import ModelFolder

    half = placement_with_slots(gpt_oss_20b, gpt_oss_20b.total_experts // 2)
    assert gpt_oss_20b.mxfp4_experts and cpu_tier_idle(gpt_oss_20b, half, H200_MEASURED_RATES) is None
    dense = ModelFacts.from_folder(ModelFolder.open(tiny_gpt_oss_dense))
    assert not dense.mxfp4_experts
    assert "in MXFP4 only" in cpu_tier_idle(dense, placement_with_slots(dense, 4), H200_MEASURED_RATES)
    monkeypatch.setattr(plan_cpu_tier, "built_cpu_kernels", lambda: None)
    assert "were not built" in cpu_tier_idle(gpt_oss_20b, half, H200_MEASURED_RATES)
    with_threads = predict_decode(gpt_oss_20b, half, 2, H200_MEASURED_RATES, cpu_threads=8)
    assert with_threads == predict_decode(gpt_oss_20b, half, 2, H200_MEASURED_RATES)
