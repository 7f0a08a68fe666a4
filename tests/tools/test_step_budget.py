"""StepBudget fits a training phase's step count to its wall time, from the speed measured after the first
steps, and fits it again as the speed changes."""

import pytest

from tools.demo import target
from tools.demo.target import StepBudget


class Clock:
    def __init__(self):
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def clock(monkeypatch) -> Clock:
    fake = Clock()
    monkeypatch.setattr(target.time, "monotonic", fake)
    return fake


def run(budget: StepBudget, steps: int, clock: Clock, seconds_per_step) -> int:
    """Steps taken until the budget's count is reached; seconds_per_step(step) is each step's cost."""
    step = 0
    while step < steps:
        clock.now += seconds_per_step(step)
        step += 1
        steps = budget.fit(step, steps)
    return steps


def test_the_count_shrinks_to_the_time_at_a_steady_speed(clock):
    assert run(StepBudget(100.0), 10_000, clock, lambda step: 0.1) == pytest.approx(1000, abs=2)


def test_slow_first_steps_do_not_cost_the_later_ones(clock):
    """The first 100 steps at 0.5 s, then 0.1 s: a fit only at the start would stop at step 200, and the
    best is 100 + 50 s / 0.1 s = 600."""
    taken = run(StepBudget(100.0), 10_000, clock, lambda step: 0.5 if step < 100 else 0.1)
    assert 590 <= taken <= 600


def test_never_more_steps_than_asked_and_no_budget_changes_nothing(clock):
    assert run(StepBudget(1000.0), 300, clock, lambda step: 0.1) == 300
    assert run(StepBudget(None), 300, clock, lambda step: 5.0) == 300
