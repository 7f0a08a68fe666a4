"""The acceptance rules keep the target's distribution: chi-square goodness of fit of the emitted tokens
against the exact target distribution on a small vocabulary, including speculation.md's adversarial
cases, and first-position acceptance ≈ 1 − TV(p, q) (p(d) for a one-hot proposal)."""

import pytest
import torch

from app.engine.generation.sampling import Sampler, SamplingParams
from app.engine.spec.accept import accept_one_hot, accept_sampled

TRIALS = 8000
V = 5


def chi_square_p_value(samples: list[int], probs: torch.Tensor) -> float:
    """P(a chi-square statistic at least this large | samples drawn from probs); tokens of
    probability 0 must never appear."""
    counts = torch.bincount(torch.tensor(samples), minlength=len(probs)).double()
    expected = probs.double() * len(samples)
    support = expected > 0
    assert counts[~support].sum() == 0, "a token outside the target's support was emitted"
    statistic = ((counts[support] - expected[support]) ** 2 / expected[support]).sum()
    degrees = int(support.sum()) - 1
    if degrees == 0:
        return 1.0
    return float(torch.special.gammaincc(torch.tensor(degrees / 2), statistic / 2))


def assert_rate(observed: int, trials: int, expected: float) -> None:
    """Within 4.5 standard deviations of a binomial."""
    sigma = max((expected * (1 - expected) / trials) ** 0.5, 1e-9)
    assert abs(observed / trials - expected) <= 4.5 * sigma + 1e-9, (observed / trials, expected)


def rows(*values) -> torch.Tensor:
    table = torch.tensor(values, dtype=torch.float32)
    return table / table.sum(-1, keepdim=True)


P = rows([0.1, 0.4, 0.2, 0.3, 0.0], [0.25, 0.05, 0.3, 0.2, 0.2], [0.5, 0.1, 0.1, 0.1, 0.2])
CASES = {
    "p equals q": (P, P[:2].clone()),
    "disjoint supports": (rows([0.5, 0.5, 0, 0, 0], [0.3, 0.7, 0, 0, 0], [1, 1, 1, 1, 1]),
                          rows([0, 0, 0.2, 0.3, 0.5], [0, 0, 0.4, 0.4, 0.2])),
    "one-hot q": (P, rows([0, 1, 0, 0, 0], [0, 0, 1, 0, 0])),
    "q is 0 where p is not": (P, rows([0, 0.5, 0.5, 0, 0], [0.5, 0, 0, 0.5, 0])),
    "q broader than p": (rows([0.7, 0.3, 0, 0, 0], [0, 0, 0, 0.1, 0.9], [1, 1, 1, 1, 1]),
                         rows([1, 1, 1, 1, 1], [1, 1, 1, 1, 1])),
}


@pytest.mark.parametrize("case", CASES)
def test_sampled_drafts_keep_the_target_distribution(case):
    p, q = CASES[case]
    sampler = Sampler(SamplingParams(temperature=1.0, seed=11), torch.device("cpu"))
    first, second, kept_first = [], [], 0
    for _ in range(TRIALS):
        drafts = sampler.draw(q)
        kept, token = accept_sampled(drafts, q, p, sampler)
        emitted = [*drafts[:kept], token]
        first.append(emitted[0])
        kept_first += kept >= 1
        if kept >= 1:
            second.append(emitted[1])  # the target's token at position 1, given the kept draft
    assert chi_square_p_value(first, p[0]) > 1e-3
    assert_rate(kept_first, TRIALS, float(torch.minimum(p[0], q[0]).sum()))  # 1 − TV(p, q)
    if len(second) > 500:
        assert chi_square_p_value(second, p[1]) > 1e-3


@pytest.mark.parametrize(("draft", "params"), [
    (1, dict(temperature=1.0)),  # a likely draft
    (4, dict(temperature=1.0)),  # a draft the target never emits: p(d) = 0
    (0, dict(temperature=0.7, top_k=3)),  # the target's own top-k / temperature apply
])
def test_one_hot_drafts_keep_the_target_distribution(draft, params):
    sampler = Sampler(SamplingParams(seed=5, **params), torch.device("cpu"))
    logits = torch.log(P.clamp_min(1e-30))  # [3, V]: two drafts and the bonus position
    p = sampler.probabilities(logits)
    first, kept_first = [], 0
    for _ in range(TRIALS):
        kept, token = accept_one_hot([draft, 2], logits, sampler)
        first.append(draft if kept >= 1 else token)
        kept_first += kept >= 1
    assert chi_square_p_value(first, p[0]) > 1e-3
    assert_rate(kept_first, TRIALS, float(p[0, draft]))


def test_greedy_keeps_drafts_while_they_are_the_argmax_and_then_emits_the_argmax():
    logits = torch.tensor([[0.0, 5, 0, 0, 0], [0, 0, 5, 0, 0], [0, 0, 0, 5, 0], [5, 0, 0, 0, 0]])
    greedy = Sampler(SamplingParams(), torch.device("cpu"))
    assert accept_one_hot([1, 2, 3], logits, greedy) == (3, 0)  # all kept, the bonus from the last position
    assert accept_one_hot([1, 4, 3], logits, greedy) == (1, 2)
    assert accept_one_hot([0, 2, 3], logits, greedy) == (0, 1)  # none kept
    assert accept_one_hot([], logits[:1], greedy) == (0, 1)  # a plain step
