"""The CPU expert tier (app/kernels/cpu_share.py, app/engine/experts/cpu_tier.py, app/kernels/cpu/cpu_share.c), in
Triton's interpreter with the host's thread serving for real: the hand-over kernels against their references, the
split against every possible count, and decoding with the tier against decoding without it."""

import threading

import pytest
import torch

from app.engine.experts.cpu_tier import CpuTier, CpuTierError
from app.engine.loader import load_model
from app.kernels import cpu_share
from app.kernels.cpu_share import (
    CPU_COMPUTED,
    DONE,
    REQUEST,
    TOKENS,
    CpuShareBuffers,
    add_cpu_share,
    add_cpu_share_torch,
    post_cpu_share,
    post_cpu_share_torch,
)
from app.kernels.expert_resolve import MISSES
from app.model_folder import ModelFolder
from app.plan_cpu_tier import cpu_count
from tests.engine.greedy import greedy_with_stats
from tests.fixtures.tiny_glm import write_tiny_glm
from tests.kernels.test_device_misses import PROMPT, check_residency, loaded

NUM_EXPERTS, HIDDEN = 12, 40
# a call whose hidden states span two whole BLOCKs of cpu_share.py and a tail
WIDE_TOKENS, WIDE_HIDDEN = 9, 240


def buffers(tokens: int, picks: int, costs: tuple[float, float, float], hidden_size: int = HIDDEN) -> CpuShareBuffers:
    b = CpuShareBuffers.allocate(tokens, picks, hidden_size, torch.device("cpu"))
    b.costs.copy_(torch.tensor(costs))
    b.ticket.fill_(6)
    return b


@pytest.mark.parametrize("misses", range(5))
@pytest.mark.parametrize("pairs", [1, 3])
def test_the_count_makes_the_slower_side_as_fast_as_any_count_can(misses, pairs):
    for costs in ([1.0, 0.0, 1.0], [0.27e-3, 0.03e-3, 0.3e-3], [1.0, 5.0, 0.1], [1.0, 0.0, 3.0]):
        fetch, call, pair = costs
        per = pair * pairs

        def slower(count, fetch=fetch, call=call, per=per):
            return max((misses - count) * fetch, call + count * per if count else 0.0)

        count = cpu_count(misses, pairs * misses, costs)
        assert 0 <= count <= misses
        assert slower(count) == min(slower(c) for c in range(misses + 1))
        assert all(slower(c) > slower(count) for c in range(count))  # fewer on a tie


@pytest.mark.parametrize(("tokens", "picks", "resident", "costs", "hidden_size"), [
    (1, 4, (), (1.0, 0.0, 1.0), HIDDEN),
    (1, 4, (0, 3, 5), (1.0, 0.0, 1.0), HIDDEN),
    (1, 2, (), (1.0, 3.0, 1.0), HIDDEN),  # a call costs more than fetching both: nothing for the CPU
    (3, 4, (1, 2), (1.0, 0.37, 0.29), HIDDEN),  # costs with no ties between two counts
    (16, 4, tuple(range(0, 12, 2)), (2.0, 1.1, 0.13), HIDDEN),
    (WIDE_TOKENS, 4, (1, 4, 7), (2.0, 1.1, 0.13), WIDE_HIDDEN),  # the copy of the hidden states loops
])
def test_post_matches_its_reference(tokens, picks, resident, costs, hidden_size):
    generator = torch.Generator().manual_seed(tokens * 10 + picks)
    layer, store_base = 2, 24
    experts = torch.stack([torch.randperm(NUM_EXPERTS, generator=generator)[:picks] for _ in range(tokens)]).flatten()
    experts[1] = -1 if tokens > 1 else experts[1]
    weights = torch.rand(tokens * picks, generator=generator)
    hidden = torch.randn(tokens, hidden_size, generator=generator)
    slot_of = torch.full((4, NUM_EXPERTS + 1), -1, dtype=torch.long)
    slot_of[layer, list(resident)] = torch.arange(len(resident))
    results = []
    for post in (post_cpu_share, post_cpu_share_torch):
        uses = torch.zeros(4, NUM_EXPERTS, dtype=torch.int32)
        counts = torch.zeros(5, dtype=torch.long)
        b = buffers(tokens, picks, costs, hidden_size)
        picks_left = post(experts, weights, hidden, layer, store_base, slot_of, uses, counts, b)
        results.append((picks_left, uses, counts, b))
    (got, uses, counts, b), (want, want_uses, want_counts, want_b) = results
    assert torch.equal(got, want) and torch.equal(uses, want_uses) and torch.equal(counts, want_counts)
    for name, value, expected in zip(CpuShareBuffers._fields, b, want_b, strict=True):
        assert torch.equal(value, expected), name
    on_cpu = (got < 0) & (experts >= 0)
    assert int(counts[CPU_COMPUTED]) == len(set(experts[on_cpu].tolist())) == int(counts[MISSES])
    if costs[1] >= 2.0:
        assert not on_cpu.any() and int(b.pending) == 0
    else:
        assert on_cpu.any() and int(b.pending) == int(b.ticket) == 7 == int(b.control[REQUEST])
        assert int(b.control[TOKENS]) == tokens and torch.equal(b.x, hidden)
        assert torch.equal(b.slots[on_cpu], experts[on_cpu] + store_base) and (b.slots[~on_cpu] == -1).all()
        assert not set(experts[on_cpu].tolist()) & set(resident)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("pending", [0, 7])
@pytest.mark.parametrize(("tokens", "hidden_size"), [(3, HIDDEN), (WIDE_TOKENS, WIDE_HIDDEN)],
                         ids=["one-program", "programs-and-tail"])
def test_add_matches_its_reference(dtype, pending, tokens, hidden_size):
    b = buffers(tokens, 4, (1.0, 0.0, 1.0), hidden_size)
    b.pending.fill_(pending)
    b.control[DONE] = 7
    b.out.normal_()
    before = torch.randn(tokens, hidden_size).to(dtype)
    out, want = before.clone(), before.clone()
    add_cpu_share(out, b)
    add_cpu_share_torch(want, b)
    # within a bfloat16 step: Triton's interpreter rounds to bfloat16 towards zero
    torch.testing.assert_close(out, want, rtol=2**-7 if dtype == torch.bfloat16 else 0, atol=0)
    assert int(b.failed) == 0
    expected = before.float() + b.out if pending else before.float()
    torch.testing.assert_close(out.float(), expected, rtol=2**-7 if dtype == torch.bfloat16 else 1e-6, atol=1e-6)


def test_a_wait_the_host_never_answers_gives_up_and_flags_it(monkeypatch):
    monkeypatch.setattr(cpu_share, "WAIT_LOADS", 50)
    b = buffers(1, 4, (1.0, 0.0, 1.0))
    b.pending.fill_(3)
    b.control[DONE] = 2
    add_cpu_share(torch.zeros(1, HIDDEN), b)
    assert int(b.failed) == 1


@pytest.fixture(scope="module")
def tiny_glm_fp8(tmp_path_factory):
    return write_tiny_glm(tmp_path_factory.mktemp("glm-fp8"), "glm4_moe_fp8", mtp=False)


def with_cpu_tier(folder, slots: int, call_costs=(0.0, 1.0), threads: int = 2):
    """The offloaded model with a CPU tier whose costs (fetching an expert costs as much as computing a pair)
    give the CPU about half of each call's misses; its `threads` split each call's rows (team.c)."""
    loaded_model = loaded(folder, slots)
    model, store = loaded_model.model, loaded_model.model.experts.store
    tier = CpuTier(store, model.run_experts, loaded_model.facts.hidden_size, loaded_model.facts.top_k, 16, threads,
                   torch.device("cpu"), fetch_s=1.0, call_costs=call_costs)
    model.experts.device_misses.cpu_tier = tier
    return loaded_model, tier


@pytest.mark.usefixtures("built_library")
def test_decoding_with_the_cpu_tier_gives_the_tokens_of_decoding_without_it(tiny_glm_fp8):
    """GLM in FP8 (GPT-OSS's single-token experts are slow in the interpreter: its verify block is below)."""
    folder = tiny_glm_fp8
    with_tier, tier = with_cpu_tier(folder, 3)
    tokens, stats = greedy_with_stats(with_tier, PROMPT, 8)
    expected, expected_stats = greedy_with_stats(loaded(folder, 3), PROMPT, 8)
    assert tokens == expected and len(set(tokens)) > 3
    work = stats.expert_cache
    assert work.hits + work.misses == expected_stats.expert_cache.hits + expected_stats.expert_cache.misses
    assert 0 < work.cpu_computed < work.misses
    assert work.bytes_fetched == (work.misses - work.cpu_computed) * with_tier.facts.expert_bytes
    assert int(tier.buffers.control[DONE]) == int(tier.buffers.ticket) > 0  # every hand-over answered
    check_residency(with_tier.model.experts)
    tier.close()


@pytest.mark.usefixtures("built_library")
def test_a_verify_block_with_the_cpu_tier_gives_the_logits_of_every_expert_resident(tiny_gpt_oss):
    (with_tier, tier), resident = with_cpu_tier(tiny_gpt_oss, 3, threads=3), loaded(tiny_gpt_oss, None)
    logits = []
    with torch.inference_mode():
        for model in (with_tier.model, resident.model):
            cache = model.new_kv_cache(32)
            model.forward(torch.tensor(PROMPT), cache)
            logits.append(model.forward(torch.tensor([7, 8, 9, 10, 11]), cache))
        with_tier.model.experts.settle()
    got, want = logits
    assert (got - want).abs().max() <= 1e-4 * want.abs().max()
    assert with_tier.model.experts.stats.cpu_computed > 0
    tier.close()


@pytest.mark.usefixtures("built_library")
def test_a_tier_that_stopped_answering_is_an_error_at_the_next_settle(tiny_glm_fp8, monkeypatch):
    monkeypatch.setattr(cpu_share, "WAIT_LOADS", 50)
    with_tier, tier = with_cpu_tier(tiny_glm_fp8, 3)
    tier.close()
    with pytest.raises(CpuTierError, match="--cpu-threads 0"):
        greedy_with_stats(with_tier, PROMPT, 4)


@pytest.mark.usefixtures("built_library")
def test_the_measured_costs_come_from_the_serving_thread(tiny_gpt_oss):
    model = load_model(ModelFolder.open(tiny_gpt_oss), dtype="float32", context=64)
    store = model.model.experts.store
    tier = CpuTier(store, model.model.run_experts, model.facts.hidden_size, model.facts.top_k, 16, 1,
                   torch.device("cpu"), fetch_s=1.0)
    assert tier.call_s >= 0 and 0 < tier.pair_s < 0.1
    assert torch.allclose(tier.buffers.costs, torch.tensor([1.0, tier.call_s, tier.pair_s]))
    answered = int(tier.buffers.control[DONE])
    assert answered == int(tier.buffers.control[REQUEST]) > 0
    assert int(tier.buffers.ticket) == answered  # the device's next ticket is one the host has not answered
    tier.close()
    assert not any(t.name == "cpu-experts" and t.is_alive() for t in threading.enumerate())


@pytest.mark.usefixtures("built_library")
def test_a_cost_measurement_in_which_more_experts_took_no_longer_than_one_is_taken_again(tiny_glm_fp8, monkeypatch):
    _, tier = with_cpu_tier(tiny_glm_fp8, 3)
    more = min(3, tier.buffers.slots.numel() // tier.buffers.x.shape[0])
    calls_an_attempt = 2 * (9 + 2)  # the default repeats and warm-ups, of each count
    # something held the cores during the first attempt, not during the second
    attempts = [{1: 1.5e-3, more: 1.5e-3}, {1: 0.6e-3, more: 0.6e-3 + (more - 1) * 0.4e-3}]
    calls = []

    def timed_call(layer_index, count):
        calls.append(count)
        return attempts[(len(calls) - 1) // calls_an_attempt][count]

    monkeypatch.setattr(tier, "_timed_call", timed_call)
    call_s, pair_s = tier.measured_call_costs()
    assert len(calls) == 2 * calls_an_attempt
    assert pair_s == pytest.approx(0.4e-3) and call_s == pytest.approx(0.2e-3)
    tier.close()
