import pytest
import torch

from app.engine.generation.sampling import Sampler, SamplingParams

LOGITS = torch.tensor([2.0, 1.0, 0.5, 0.0, -1.0, 3.0])


def distribution(**params) -> torch.Tensor:
    return Sampler(SamplingParams(**params), torch.device("cpu")).probabilities(LOGITS)


def test_greedy_is_argmax():
    sampler = Sampler(SamplingParams(), torch.device("cpu"))
    assert sampler.sample(LOGITS) == 5
    assert torch.equal(sampler.probabilities(LOGITS), torch.eye(6)[5])


def test_temperature_scales_the_softmax():
    assert torch.allclose(distribution(temperature=0.5), torch.softmax(LOGITS / 0.5, -1))


def test_top_k_keeps_the_k_largest_renormalised():
    expected = torch.zeros(6)
    expected[[0, 5]] = torch.softmax(LOGITS[[0, 5]], -1)
    assert torch.allclose(distribution(temperature=1.0, top_k=2), expected)


def test_top_p_keeps_the_smallest_prefix_reaching_p():
    full = torch.softmax(LOGITS, -1)  # sorted: 5 (.56), 0 (.21), 1 (.08), ...
    kept = distribution(temperature=1.0, top_p=0.7)
    assert set(torch.nonzero(kept).flatten().tolist()) == {5, 0}
    assert torch.allclose(kept[[5, 0]], full[[5, 0]] / full[[5, 0]].sum())


def test_seeded_sampling_repeats_and_follows_the_distribution():
    params = SamplingParams(temperature=1.0, top_k=4, seed=1234)
    first = [Sampler(params, torch.device("cpu")).sample(LOGITS) for _ in range(3)]
    assert len(set(first)) == 1  # a fresh sampler with the same seed draws the same token
    sampler = Sampler(params, torch.device("cpu"))
    draws = torch.tensor([sampler.sample(LOGITS) for _ in range(4000)])
    frequencies = torch.bincount(draws, minlength=6).float() / len(draws)
    assert torch.allclose(frequencies, sampler.probabilities(LOGITS), atol=0.03)
    assert frequencies[[3, 4]].sum() == 0  # outside the top 4


@pytest.mark.parametrize("params", [dict(temperature=0.7, top_p=0.9), dict(temperature=1.3, top_k=3, top_p=0.8)])
def test_probabilities_sum_to_one(params):
    assert distribution(**params).sum() == pytest.approx(1.0)
