"""The cost-aware block size of each speculative step: running statistics of the generation turned into the
inputs of `policy.choose_block_size`."""

import math
from collections import Counter

import numpy as np

from app.engine.experts.cache import ExpertCache
from app.engine.spec.policy import StepCosts, choose_block_size, expected_fetches
from app.plan import Hardware

FADE = 0.95  # weight of the past per new observation: acceptance and cache state move with the text
PRIOR_ACCEPTANCE = 0.5  # for the first draft position before any verify; later positions start at the one before
PRIOR_WEIGHT = 2.0  # observations' worth of the prior
PROBE_AFTER = 32  # plain steps in a row, at least, then one verify checks whether drafting pays again: the
                  # block that would pay most (a block of 2 saw one draft, and at an estimate held low by the
                  # prior never paid); the wait doubles after every probe that changes nothing
PROBE_SHARE = 0.02  # a probe's extra cost over a plain step, as a share of the plain steps it waits for
RECHECK_EVERY = 8  # plain steps in a row between two looks at the policy (on the host: the streak runs on)
FETCH_BANDWIDTH = {"cuda": Hardware().link_bps, "cpu": 10e9}  # bytes/s before steps are timed; on CPU a memcpy
WARMED_UP: set[int] = set()  # block sizes some step of this process ran: their kernels are compiled, their
                             # libraries' workspaces allocated, so a later first step of that size is timed


class AcceptanceRates:
    """Per draft position, the faded share of steps that reached it and kept it."""

    def __init__(self, drafts: int):
        self.reached = [0.0] * drafts
        self.kept = [0.0] * drafts

    def record(self, block_size: int, accepted: int) -> None:
        for i in range(min(accepted + 1, block_size - 1)):  # the kept drafts and the first rejected one
            self.reached[i] = FADE * self.reached[i] + 1
            self.kept[i] = FADE * self.kept[i] + (i < accepted)

    def rates(self) -> list[float]:
        rates, prior = [], PRIOR_ACCEPTANCE
        for reached, kept in zip(self.reached, self.kept, strict=True):
            prior = (kept + PRIOR_WEIGHT * prior) / (reached + PRIOR_WEIGHT)
            rates.append(prior)
        return rates


class StepCostFit:
    """seconds ≈ single·[B = 1] + verify·[B > 1] + position·B·[B > 1] + fetch·(experts copied), least squares over
    fading steps. Until several block sizes are seen, a verify's time goes on its fixed part (a batch-1 GPU pass
    reads the same weights whatever B); the fetch term is held near its prior (expert bytes / bandwidth) with
    the weight of one step copying `prior_copies` experts. Steps are folded in lazily, when costs are asked for."""

    def __init__(self, fetch_s: float, prior_copies: int):
        self.gram = np.zeros((4, 4))
        self.moment = np.zeros(4)
        self.prior = np.array([0.0, 0.0, 0.0, fetch_s])
        self.prior_weight = np.diag([1e-9, 1e-9, 1e-3, float(prior_copies) ** 2])
        self.steps: list[tuple[float, float, float, float, float]] = []  # (features …, seconds) not folded yet

    def add(self, block_size: int, fetched: float, seconds: float) -> None:
        single = float(block_size == 1)
        self.steps.append((single, 1 - single, (1 - single) * block_size, fetched, seconds))

    def costs(self) -> StepCosts:
        if self.steps:
            table = np.array(self.steps)
            rows, seconds = table[:, :4], table[:, 4]
            weighted = rows * FADE ** np.arange(len(rows) - 1, -1, -1)[:, None]
            self.gram = FADE ** len(rows) * self.gram + weighted.T @ rows
            self.moment = FADE ** len(rows) * self.moment + weighted.T @ seconds
            self.steps = []
        fitted = np.linalg.solve(self.gram + self.prior_weight, self.moment + self.prior_weight @ self.prior)
        return StepCosts(*np.maximum(fitted, 0).tolist())


class BlockSizer:
    """`choose(room)` before a step, `record(...)` after it. The first steps verify two positions, then plain ones,
    so both kinds are timed before the policy decides. Not timed: the first step of a size in this process
    (`warmed_up`: it pays for compiling and allocating), and a verify after the prompt or plain steps (its drafter
    first catches up on every committed position). In a plain streak the decision is rechecked every
    `RECHECK_EVERY` steps and a probe costs about `PROBE_SHARE` of the streak, so not speculating stays cheap."""

    def __init__(self, experts: ExpertCache, top_k: int, max_block: int, fetch_bandwidth: float | None = None,
                 warmed_up: set[int] = WARMED_UP):
        self.experts = experts
        self.top_k = top_k
        self.acceptance = AcceptanceRates(max_block - 1)
        bandwidth = fetch_bandwidth or FETCH_BANDWIDTH[experts.device.type]
        self.costs = StepCostFit(experts.store.expert_bytes / bandwidth, top_k * len(experts.store.layers))
        self.locality = 1.0
        self.timed = Counter()  # steps whose time was fitted, by "single" / "verify"
        self.warmed_up = warmed_up
        self.plain_streak = 0
        self.probe_after = PROBE_AFTER
        self.probes = 0  # probes since the policy last chose to draft
        self.drafted_last = False  # whether the last step drafted: else the drafter has positions to take in
        self.policy_said_plain = False
        self._uniform_fetches: list[float] | None = None

    def choose(self, room: int) -> int:
        """room ≥ 1."""
        self._uniform_fetches = None
        if room == 1 or self.holds_plain():
            return 1
        self.policy_said_plain = False
        self._uniform_fetches = self._expected_fetches(room)
        if not self.timed["verify"]:
            return min(2, room)  # the cheapest verify: at a small budget a long one fetches many experts
        if not self.timed["single"]:
            return 1
        fetches = self._calibrated(self._uniform_fetches)
        costs, rates = self.costs.costs(), self.acceptance.rates()
        if self.plain_streak >= self.probe_after:
            self.probes += 1
            return choose_block_size(rates, fetches, costs, smallest=2)
        size = choose_block_size(rates, fetches, costs)
        self.policy_said_plain = size == 1
        if size == 1:
            probe = choose_block_size(rates, fetches, costs, smallest=2)
            self.probe_after = _probe_gap(costs, fetches, probe) * 2**self.probes
        else:
            self.probes = 0
        return size

    def holds_plain(self, steps: int = 0) -> bool:
        """Whether `choose` returns 1 without a look at the policy after `steps` more plain steps, as far as the
        sizer knows now: in a plain streak such steps may run ahead of the host. The policy's rechecks in a streak
        (`record`) need no step to finish first, so only a recheck that finds drafting pays ends the hold."""
        return self.policy_said_plain and self.plain_streak + steps < self.probe_after

    def record(self, block_size: int, accepted: int, seconds: float, fetched: float) -> None:
        """What the step chosen last did: drafts kept, wall time, experts copied to the device."""
        self.acceptance.record(block_size, accepted)
        catching_up = block_size > 1 and not self.drafted_last
        if block_size in self.warmed_up and not catching_up:
            self.costs.add(block_size, fetched, seconds)
            self.timed["single" if block_size == 1 else "verify"] += 1
        self.warmed_up.add(block_size)
        self.drafted_last = block_size > 1
        self.plain_streak = self.plain_streak + 1 if block_size == 1 else 0
        if self.policy_said_plain and self.plain_streak % RECHECK_EVERY == 0:
            self.policy_said_plain = self._policy_stays_plain()
        predicted = self._uniform_fetches[block_size - 1] if self._uniform_fetches else 0.0
        if predicted > 0:
            self.locality = FADE * self.locality + (1 - FADE) * fetched / predicted

    def _policy_stays_plain(self) -> bool:
        """The policy's verdict on the estimates the host holds, for a block as long as the drafter's."""
        rates = self.acceptance.rates()
        return choose_block_size(rates, self._calibrated(self._expected_fetches(len(rates) + 1)),
                                 self.costs.costs()) == 1

    def _calibrated(self, fetches: list[float]) -> list[float]:
        """Uniform routing's expected fetches scaled to what steps really fetched."""
        return [self.locality * f for f in fetches]

    def _expected_fetches(self, room: int) -> list[float]:
        """Before calibration by `locality`: what cache state and uniform routing predict."""
        if self.experts.complete:
            return [0.0] * room
        store = self.experts.store
        resident = Counter(layer for layer, _ in self.experts.resident())
        missing = [store.num_experts - resident[layer] for layer in store.layers]
        return expected_fetches(missing, store.num_experts, self.top_k, room, 1.0)


def _probe_gap(costs: StepCosts, fetches: list[float], probe: int) -> int:
    """Plain steps before a probe (a block of `probe`) such that its extra cost is `PROBE_SHARE` of theirs."""
    plain = max(costs.step_seconds(1, fetches[0]), 1e-9)
    extra = costs.step_seconds(probe, fetches[probe - 1]) - plain
    return max(PROBE_AFTER, math.ceil(extra / plain / PROBE_SHARE))
