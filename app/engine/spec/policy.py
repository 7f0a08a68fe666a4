"""How many positions B a speculative step should verify (B = 1: plain decoding), picking the most expected tokens
per second (`StepCosts.step_seconds`). On an offloaded MoE a pass needs the union of its positions' experts in
every layer, so a long block can cost more in fetches than the tokens it wins.
"""

from collections.abc import Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class StepCosts:
    single_s: float  # a one-position step, fetches excluded
    verify_s: float  # a step of B > 1 positions (drafter pass included), fetches and per-position work excluded
    position_s: float  # each verified position
    fetch_s: float  # one expert copied to the device (its bytes / the fetch bandwidth)

    def step_seconds(self, block_size: int, fetches: float) -> float:
        if block_size == 1:
            return self.single_s + self.fetch_s * fetches
        return self.verify_s + self.position_s * block_size + self.fetch_s * fetches


def expected_tokens(acceptance: Sequence[float]) -> list[float]:
    """acceptance[i] = P(draft i + 1 kept | the drafts before it kept) -> expected tokens for B = 1 … len + 1."""
    tokens, reach = [1.0], 1.0
    for rate in acceptance:
        reach *= rate
        tokens.append(tokens[-1] + reach)
    return tokens


def expected_fetches(missing_per_layer: Sequence[int], num_experts: int, top_k: int, max_block: int,
                     locality: float) -> list[float]:
    """Experts a step of B = 1 … max_block copies: B uniform tokens touch E·(1 - (1 - k/E)^B) experts a layer, of
    which missing / E are absent; `locality` scales that to what steps really fetched (real routing reuses)."""
    untouched = 1 - top_k / num_experts
    missing = sum(missing_per_layer) / num_experts
    return [locality * missing * num_experts * (1 - untouched**block) for block in range(1, max_block + 1)]


def choose_block_size(acceptance: Sequence[float], fetches: Sequence[float], costs: StepCosts,
                      smallest: int = 1) -> int:
    """fetches[B - 1]: experts a step of B positions is predicted to copy; B ≥ `smallest` (2: the best verify)."""
    tokens = expected_tokens(acceptance[: len(fetches) - 1])
    sizes = range(min(smallest, len(tokens)), len(tokens) + 1)
    return max(sizes, key=lambda b: tokens[b - 1] / max(costs.step_seconds(b, fetches[b - 1]), 1e-12))
