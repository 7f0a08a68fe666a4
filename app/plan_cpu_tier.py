"""The CPU expert tier in the performance model (pure Python, so the desktop app plans with it): how fast the host's
cores compute routed experts, and how a layer call's misses split between the device fetching them and the CPU
computing them, the one split the engine uses too (app/kernels/cpu_share.py)."""

from __future__ import annotations

import os
from dataclasses import dataclass
from math import comb
from typing import TYPE_CHECKING

from app.cpu_kernel_build import built_cpu_kernels
from app.curves import interpolated

if TYPE_CHECKING:
    from app.plan import Hardware, ModelFacts, Placement, Prediction

# The predicted speed-up for which the app starts the tier with every core but one until the user chooses a count,
# and `moechat plan` suggests it: on the H200 the tier decoded 1.5-1.7x faster at 10 % and 25 % of gpt-oss-20b's
# experts on the GPU (bench/NOTES.md); where it would gain little it is not worth the busy cores.
TIER_WORTH_IT = 1.1


@dataclass(frozen=True)
class CpuExpertRates:
    """The host's cores computing routed experts for one token. `expert_s_by_threads`: (threads, seconds for an
    expert of `expert_bytes`), threads ascending; between two measured thread counts the rate (bytes a second) is
    interpolated, below the first it scales with the threads, beyond the last it stays (the host's memory bandwidth
    caps it, and nothing measured says otherwise). `step_slowdown`: how much slower than alone they compute inside
    the decode step; `call_s`: a layer call's fixed cost (the hand-over, waking the threads)."""

    expert_bytes: int
    expert_s_by_threads: tuple[tuple[int, float], ...]
    step_slowdown: float
    call_s: float

    def bytes_per_s(self, threads: int) -> float:
        rates = [(0, 0.0), *((count, self.expert_bytes / seconds) for count, seconds in self.expert_s_by_threads)]
        return interpolated(rates, threads)

    def pair_s(self, threads: int, expert_bytes: int) -> float:
        """Seconds a decode step's CPU share takes per (token, expert) pair, on `threads` cores."""
        return expert_bytes / self.bytes_per_s(threads) * self.step_slowdown


# The C kernel alone (bench/results/cpu-expert-rate-h200-2026-12-02-avx512.json: the H200 host, 16 cores, its AVX-512
# tile, one token, experts not in the caches), for gpt-oss-20b's MXFP4 experts as the host store holds them. The
# tier's own measurement at load, through its team of threads (bench/results/decode-gpt-oss-20b-2026-12-02-cpu-tier-
# avx512.json, 15 threads, steps in CUDA graphs; the mean of its 10 % and 25 % runs): a call 0.077 ms, an expert
# 0.2035 ms, where the kernel alone takes 0.225 ms at 15 threads. The planner prices the step with the tier's figures:
# it scales the kernel's rates by their ratio and takes the call's cost. Its split then gives the CPU about the experts
# per token the engine's gave there (tests/test_plan_cpu_tier.py). Replace the figures as the kernel and the tier
# change (bench/cpu_expert_rate.py, bench/decode_gpt_oss.py --cpu-threads).
HOST_CPU_EXPERTS = CpuExpertRates(
    expert_bytes=13_253_760,
    expert_s_by_threads=((8, 0.354e-3), (12, 0.246e-3), (15, 0.225e-3), (16, 0.199e-3)),
    step_slowdown=0.2035 / 0.225,
    call_s=0.077e-3,
)


def miss_s(misses: int, count: int, costs: tuple[float, float, float]) -> float:
    """A layer call's miss time (`costs`: a fetch's seconds, a call's, an expert's on the CPU) when the CPU computes
    `count` of its `misses`: the slower of the device fetching the rest and the CPU computing its share."""
    fetch_s, call_s, expert_s = costs
    return max((misses - count) * fetch_s, call_s + count * expert_s if count else 0.0)


def cpu_count(misses: int, pairs: int, costs: tuple[float, float, float] | list[float]) -> int:
    """How many of `misses` experts (`pairs` (token, expert) pairs between them) the CPU computes (`costs`: a
    fetch's seconds, a call's, a pair's): of the two counts around where fetching and computing take equally long,
    the one whose miss time is less (fewer on a tie). The engine's split (app/kernels/cpu_share.py's device kernel
    computes the same on the GPU) and the planner's."""
    if misses == 0:
        return 0
    fetch_s, call_s, pair_s = costs
    expert_s = pair_s * pairs / misses
    even = min(max(int((misses * fetch_s - call_s) // (fetch_s + expert_s)), 0), misses)
    per_expert = (fetch_s, call_s, expert_s)
    better = even < misses and miss_s(misses, even + 1, per_expert) < miss_s(misses, even, per_expert)
    return even + 1 if better else even


def expected_share(top_k: int, miss_rate: float, costs: tuple[float, float, float]) -> tuple[float, float]:
    """(seconds the CPU's share saves, experts it computes) in a one-token layer call, expected over its misses:
    each of the `top_k` picks missing on its own at `miss_rate`."""
    saved = computed = 0.0
    for misses in range(1, top_k + 1):
        chance = comb(top_k, misses) * miss_rate**misses * (1 - miss_rate) ** (top_k - misses)
        count = cpu_count(misses, misses, costs)
        saved += chance * (misses * costs[0] - miss_s(misses, count, costs))
        computed += chance * count
    return saved, computed


def cpu_tier_idle(facts: ModelFacts, placement: Placement, hardware: Hardware, gpus: int = 1) -> str | None:
    """Why the CPU tier computes no experts under this plan, whose experts `gpus` GPUs hold (`plan_budgets` gives
    no per-GPU placements for one): the engine starts it only where one GPU serves the misses of a cache over every
    expert in RAM, with CPU kernels for the experts' format (app/engine/loader.py). None where it shares the
    misses."""
    if hardware.cpu_experts is None:
        return "no GPU: the CPU computes every expert already"
    if built_cpu_kernels() is None:
        return "the CPU expert kernels were not built (no C compiler when the package was installed)"
    if facts.model_type == "gpt_oss" and not facts.mxfp4_experts:
        return "the CPU kernels compute gpt-oss's experts in MXFP4 only, and this checkpoint's are not"
    if gpus > 1:
        return "the experts are spread over several GPUs"
    if placement.disk_experts:
        return "some experts are read from disk: the tier needs every expert in RAM"
    if placement.expert_slots >= facts.total_experts:
        return "every expert is on the GPU: there are no misses to share"
    return None


def tier_worth_it(with_tier: Prediction, without: Prediction) -> bool:
    return with_tier.tok_s_low >= TIER_WORTH_IT * without.tok_s_low


def host_cores() -> int:
    """The cores this process may run on: the most threads the tier can have."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        return os.cpu_count() or 1
