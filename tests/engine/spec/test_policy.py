"""The cost-aware block size: the pure policy on hand-computed cases, and the running statistics that
feed it (steps timed by the test, so every decision is deterministic)."""

import itertools

import pytest

from app.engine.spec.policy import StepCosts, choose_block_size, expected_fetches, expected_tokens
from app.engine.spec.sizer import PROBE_AFTER, RECHECK_EVERY, BlockSizer

FREE_FETCHES = [0.0] * 8


def test_expected_tokens_multiply_the_chance_of_reaching_each_draft():
    assert expected_tokens([]) == [1.0]
    assert expected_tokens([0.5, 0.5, 1.0]) == [1.0, 1.5, 1.75, 2.0]


def test_expected_fetches_grow_with_the_union_of_experts_and_vanish_when_all_are_resident():
    assert expected_fetches([0, 0, 0], num_experts=8, top_k=2, max_block=4, locality=1.0) == [0.0] * 4
    all_missing = expected_fetches([8, 8], num_experts=8, top_k=2, max_block=3, locality=1.0)
    # per layer: 8 · (1 − (6/8)^B): 2, 3.5, 4.625
    assert all_missing == pytest.approx([4.0, 7.0, 9.25])
    half = expected_fetches([4, 4], num_experts=8, top_k=2, max_block=3, locality=0.5)
    assert half == pytest.approx([x / 4 for x in all_missing])


def test_high_acceptance_and_free_verification_take_the_longest_block():
    costs = StepCosts(single_s=1.0, verify_s=1.0, position_s=0.0, fetch_s=0.0)
    assert choose_block_size([0.9] * 7, FREE_FETCHES, costs) == 8


def test_drafts_that_are_never_kept_mean_no_speculation():
    costs = StepCosts(single_s=1.0, verify_s=1.0, position_s=0.01, fetch_s=0.0)
    assert choose_block_size([0.0] * 7, FREE_FETCHES, costs) == 1


def test_expert_fetches_cut_the_block_where_another_position_stops_paying():
    costs = StepCosts(single_s=1.0, verify_s=1.0, position_s=0.0, fetch_s=1.0)
    # tokens 1, 1.9, 2.71, 3.439, 4.095 over seconds 2, 3, 4, 5, 6: B = 4 gives the most per second
    assert choose_block_size([0.9] * 4, [1.0, 2.0, 3.0, 4.0, 5.0], costs) == 4
    assert choose_block_size([0.9] * 4, [0.0] * 5, StepCosts(1.0, 1.0, 0.0, 1.0)) == 5


def test_a_cheap_plain_step_beats_a_verify_that_costs_more_than_its_tokens():
    # e.g. a CUDA-graph decode step against an eager verify pass
    costs = StepCosts(single_s=1.0, verify_s=3.0, position_s=0.0, fetch_s=0.0)
    assert choose_block_size([0.5] * 7, FREE_FETCHES, costs) == 1
    assert choose_block_size([0.95] * 7, FREE_FETCHES, costs) == 8


def test_the_best_verify_is_the_block_of_most_tokens_a_second_among_blocks_of_two_or_more():
    fetching = StepCosts(single_s=1.0, verify_s=1.0, position_s=0.0, fetch_s=1.0)
    # tokens 1.3, 1.39 over seconds 3, 5: past B = 2 more positions' experts cost more than their tokens
    assert choose_block_size([0.3] * 4, [0.0, 2.0, 4.0, 6.0, 8.0], fetching) == 1
    assert choose_block_size([0.3] * 4, [0.0, 2.0, 4.0, 6.0, 8.0], fetching, smallest=2) == 2
    dear = StepCosts(single_s=1.0, verify_s=3.0, position_s=0.0, fetch_s=0.0)
    assert choose_block_size([0.5] * 7, FREE_FETCHES, dear) == 1
    assert choose_block_size([0.5] * 7, FREE_FETCHES, dear, smallest=2) == 8


def test_the_room_left_caps_the_block():
    costs = StepCosts(single_s=1.0, verify_s=1.0, position_s=0.0, fetch_s=0.0)
    assert choose_block_size([0.9] * 7, [0.0] * 3, costs) == 3


def test_the_sizer_times_both_kinds_of_step_then_follows_what_it_measured(offloaded_target):
    sizer = BlockSizer(offloaded_target.experts, top_k=2, max_block=6, warmed_up=set())
    for first in (2, 2, 1, 1):  # the cheapest verify, then plain steps; the first of each size warms up
        assert sizer.choose(6) == first
        sizer.record(first, accepted=first - 1, seconds=1.0 if first not in sizer.warmed_up else 0.010, fetched=0)
    for _ in range(10):  # every draft kept, a verify costs what a plain step costs: the longest block
        assert sizer.choose(6) == 6
        sizer.record(6, accepted=5, seconds=0.010, fetched=0)
    assert sizer.choose(3) == 3  # but no more than the room left


@pytest.mark.parametrize("verify_s, gap", [(0.015, PROBE_AFTER), (0.0199, 50)])
def test_the_sizer_stops_drafting_when_nothing_is_kept_and_probes_again_later(verify_s, gap, resident_target):
    """A probe waits for at least PROBE_AFTER plain steps, and for as many as make its extra cost
    PROBE_SHARE of theirs (a verify 1.99 plain steps: 0.99 / 0.02 -> 50 steps); the next waits twice as long."""
    sizer = BlockSizer(resident_target.experts, top_k=2, max_block=6, warmed_up={1, 2})

    def step() -> int:
        size = sizer.choose(6)
        sizer.record(size, accepted=0, seconds=0.010 if size == 1 else verify_s, fetched=0)
        return size

    # warm sizes, but the first verify follows the prompt: the second is timed, then a plain step
    assert [step() for _ in range(4)] == [2, 2, 1, 1]
    choices = [step() for _ in range(gap - 2 + 1)]
    assert choices.count(1) == len(choices) - 1 and choices[-1] > 1  # one probe after a streak of plain steps
    later = [step() for _ in range(2 * gap + 1)]
    assert later.count(1) == len(later) - 1 and later[-1] > 1


def test_a_probe_verifies_the_block_that_would_pay_most(resident_target):
    """Every draft kept, but a verify costs eight plain steps: plain steps, then a probe of the longest block (one
    of 2 would see a single draft), as further positions cost nothing more."""
    sizer = BlockSizer(resident_target.experts, top_k=2, max_block=6, warmed_up={1, 2, 6})
    for size in (2, 2, 6, 6, 1, 1):
        sizer.choose(6)
        sizer.record(size, accepted=size - 1, seconds=0.080 if size > 1 else 0.010, fetched=0)
    while (size := sizer.choose(6)) == 1:
        sizer.record(1, accepted=0, seconds=0.010, fetched=0)
    assert sizer.plain_streak >= PROBE_AFTER and size == 6


def test_a_verify_after_the_prompt_or_plain_steps_is_not_timed(offloaded_target):
    """Its drafter first takes in every position committed since its last pass: on a GPU an eager pass
    over them costs many plain steps, which is not what a verify costs while drafting goes on."""
    sizer = BlockSizer(offloaded_target.experts, top_k=2, max_block=6, warmed_up={1, 2, 6})
    for size, seconds in ((2, 1.0), (2, 0.010), (1, 0.010)):  # the first verify catches up the prompt
        assert sizer.choose(6) == size
        sizer.record(size, accepted=size - 1, seconds=seconds, fetched=0)
    assert sizer.choose(6) == 6


def test_the_sizer_learns_the_cost_of_fetching_experts(offloaded_target):
    """Same acceptance, but where copying experts is slow the sizer measures it and settles on a shorter
    block (the expert union grows with the block)."""
    experts = offloaded_target.experts
    fast, slow = BlockSizer(experts, top_k=2, max_block=6), BlockSizer(experts, top_k=2, max_block=6)
    sizes = [6, 1, 2, 3, 4, 5, 6, 1, 3, 5, 2, 4] * 2
    fetched = [8, 0, 14, 3, 20, 9, 1, 12, 5, 17, 2, 7] * 2  # what the cache held varies from step to step
    for sizer, per_fetch in ((fast, 0.0), (slow, 0.004)):
        for size, copies in zip(sizes, fetched, strict=True):
            sizer.choose(6)
            sizer.record(size, accepted=min(size - 1, 2), seconds=0.010 + per_fetch * copies, fetched=copies)
    assert slow.costs.costs().fetch_s == pytest.approx(0.004, rel=0.15)  # the prior (a fast link) pulls a little
    assert slow.choose(6) < fast.choose(6)


def test_holds_plain_foretells_the_plain_steps_chosen_without_a_look_at_the_policy(offloaded_target):
    """A step foretold plain may run ahead of the host, so `holds_plain(k)` must never promise a plain step
    where `choose` would look again (a probe); the rechecks on the host, which find plain steps still pay, do not
    stop the streak."""
    sizer = BlockSizer(offloaded_target.experts, top_k=2, max_block=6, warmed_up={1, 2})
    foretold = {}  # step index -> whether it was foretold plain, from the steps before it
    looks = []  # steps whose choice looked at the policy
    for index in range(3 * PROBE_AFTER):
        for ahead in range(3):
            if sizer.holds_plain(ahead):
                foretold[index + ahead] = True
        holding = sizer.holds_plain()
        size = sizer.choose(6)
        if not holding:
            looks.append(index)
        assert not foretold.get(index) or (holding and size == 1)
        sizer.record(size, accepted=0, seconds=0.010 if size == 1 else 0.015, fetched=0)
    assert sum(foretold.values()) > 2 * PROBE_AFTER  # most plain steps are known in advance
    # the opening's steps, then each probe and the look after it: no recheck stops the streak
    assert all(b - a == 1 or b - a > RECHECK_EVERY for a, b in itertools.pairwise(looks))


def test_a_recheck_ends_the_plain_hold_once_drafting_pays_again(offloaded_target):
    """Plain steps turn slow while verifies stayed cheap: within RECHECK_EVERY plain steps the sizer stops
    holding them, before its probe is due, and drafts."""
    sizer = BlockSizer(offloaded_target.experts, top_k=2, max_block=6, warmed_up={1, 2})
    while not sizer.holds_plain():
        size = sizer.choose(6)
        sizer.record(size, accepted=0, seconds=0.010 if size == 1 else 0.015, fetched=0)
    slow = 0
    while sizer.holds_plain():
        assert sizer.choose(6) == 1
        sizer.record(1, accepted=0, seconds=0.100, fetched=0)
        slow += 1
    assert slow <= RECHECK_EVERY and sizer.plain_streak < sizer.probe_after
    assert sizer.choose(6) > 1
