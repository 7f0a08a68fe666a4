"""How many positions a speculative step should verify: pure functions of what has been measured.

A step of B positions verifies the anchor and B - 1 drafts in one target pass; B = 1 is plain decoding
(no drafter pass). It emits 1 + (drafts kept) tokens and costs

    B = 1:  single_s                                  + fetch_s × fetches(1)
    B > 1:  verify_s + position_s × B (drafter included) + fetch_s × fetches(B)

where fetches(B) counts the experts the pass must copy to the device: on an offloaded MoE the pass
needs the union of its positions' experts in every layer, so a long block can cost more than the
tokens it wins. The policy picks the B with the most expected tokens per second.
"""

from collections.abc import Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class StepCosts:
    """Seconds for the parts of a step."""

    single_s: float  # a one-position step, fetches excluded
    verify_s: float  # a step of B > 1 positions (drafter pass included), fetches and per-position work excluded
    position_s: float  # each verified position
    fetch_s: float  # one expert copied to the device (its bytes / the fetch bandwidth)

    def step_seconds(self, block_size: int, fetches: float) -> float:
        if block_size == 1:
            return self.single_s + self.fetch_s * fetches
        return self.verify_s + self.position_s * block_size + self.fetch_s * fetches


def expected_tokens(acceptance: Sequence[float]) -> list[float]:
    """acceptance[i] = P(draft i + 1 is kept | the drafts before it were kept) -> expected tokens
    emitted by a step of B = 1 … len(acceptance) + 1 positions."""
    tokens, reach = [1.0], 1.0
    for rate in acceptance:
        reach *= rate
        tokens.append(tokens[-1] + reach)
    return tokens


def expected_fetches(missing_per_layer: Sequence[int], num_experts: int, top_k: int, max_block: int,
                     locality: float) -> list[float]:
    """Experts a step of B = 1 … max_block positions is predicted to copy.

    Per MoE layer, B tokens routed independently and uniformly touch E·(1 - (1 - k/E)^B) distinct
    experts on average; the share of them that is not resident is missing / E. `locality` scales the
    sum to what steps really fetched (real routing reuses recently used, hence resident, experts).
    """
    untouched = 1 - top_k / num_experts
    missing = sum(missing_per_layer) / num_experts
    return [locality * missing * num_experts * (1 - untouched**block) for block in range(1, max_block + 1)]


def choose_block_size(acceptance: Sequence[float], fetches: Sequence[float], costs: StepCosts) -> int:
    """The block size B in 1 … len(fetches) with the most expected tokens per second.

    acceptance: per draft position, the running rate at which it is kept (see `expected_tokens`);
    fetches[B - 1]: experts a step of B positions is predicted to copy (see `expected_fetches`).
    """
    tokens = expected_tokens(acceptance[: len(fetches) - 1])
    rates = [tokens[b - 1] / max(costs.step_seconds(b, fetches[b - 1]), 1e-12) for b in range(1, len(tokens) + 1)]
    return 1 + max(range(len(rates)), key=rates.__getitem__)
