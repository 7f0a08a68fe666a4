"""The placement over several GPUs (expert parallel), one budget per GPU (pure Python).

The first GPU holds what `plan_placement` puts on a single device (resident weights, KV cache,
workspace) and a share of the expert slots; every other GPU holds expert slots and the workspace
of the expert op. When the slots of all GPUs could hold every routed expert, the experts are
spread as evenly as the budgets allow, so no link and no device carries more than it must.
"""

from dataclasses import replace

from app.errors import UserError
from app.plan import (
    PREFILL_CHUNK,
    RUNTIME_RESERVE,
    Hardware,
    ModelFacts,
    Placement,
    Prediction,
    plan_placement,
    predict_decode,
)
from app.sizes import format_size


def expert_workspace(facts: ModelFacts, context: int, dtype_bytes: int) -> int:
    """Device bytes besides the slots on a GPU that only runs experts: a dequantized expert (the
    torch op), a prefill chunk's hidden states in and out, and the allocator's reserve."""
    chunk = min(PREFILL_CHUNK, context)
    return (facts.expert_weights + 4 * chunk * facts.hidden_size) * dtype_bytes + RUNTIME_RESERVE


def plan_gpus(facts: ModelFacts, gpu_budgets: tuple[int, ...], ram_budget: int | None, context: int,
              dtype_bytes: int) -> tuple[Placement, ...]:
    """One placement per GPU (the host store and disk fields are the whole model's, the same in all).
    Raises UserError when a GPU's budget cannot hold its part."""
    try:
        first = plan_placement(facts, gpu_budgets[0], ram_budget, context, dtype_bytes)
    except UserError as error:
        raise UserError(f"GPU 0: {error}") from None
    workspace = expert_workspace(facts, context, dtype_bytes)
    capacities = [min(first.expert_slots, facts.total_experts)]
    for index, budget in enumerate(gpu_budgets[1:], start=1):
        slots = max(budget - workspace, 0) // facts.expert_bytes
        if slots < facts.top_k:
            raise UserError(
                f"GPU {index}: budget {format_size(budget)} is too small: a GPU that runs experts needs at "
                f"least {format_size(workspace + facts.top_k * facts.expert_bytes)} (workspace "
                f"{format_size(workspace)}, {facts.top_k} expert slots); raise its budget or leave it out"
            )
        capacities.append(slots)
    slots = spread(capacities, facts.total_experts)
    others = replace(first, resident_bytes=0, kv_cache_bytes=0, workspace_bytes=workspace)
    return (replace(first, expert_slots=slots[0]), *(replace(others, expert_slots=count) for count in slots[1:]))


def spread(capacities: list[int], total: int) -> list[int]:
    """Slots per GPU: all of each capacity while they add up to at most `total`; otherwise `total`
    split as evenly as the capacities allow (water filling, the smallest capacity first)."""
    if sum(capacities) <= total:
        return list(capacities)
    slots, left = [0] * len(capacities), total
    for position, index in enumerate(sorted(range(len(capacities)), key=capacities.__getitem__)):
        slots[index] = min(capacities[index], left // (len(capacities) - position))
        left -= slots[index]
    assert left == 0, (capacities, total, slots)
    return slots


def plan_budgets(facts: ModelFacts, gpu_budget: int | tuple[int, ...] | None, ram_budget: int | None, context: int,
                 dtype_bytes: int) -> tuple[Placement, tuple[Placement, ...]]:
    """(the placement, one placement per GPU): a tuple of budgets spreads the experts over that many GPUs
    and the placement is the first GPU's with every GPU's slots; a single budget gives (plan_placement, ())."""
    budgets = gpu_budget if isinstance(gpu_budget, tuple) else (gpu_budget,)
    if len(budgets) == 1:
        return plan_placement(facts, budgets[0], ram_budget, context, dtype_bytes), ()
    gpus = plan_gpus(facts, budgets, ram_budget, context, dtype_bytes)
    return replace(gpus[0], expert_slots=sum(p.expert_slots for p in gpus)), gpus


def predict_gpus(facts: ModelFacts, placement: Placement, gpus: tuple[Placement, ...], dtype_bytes: int,
                 hardware: Hardware, cpu_threads: int = 0) -> Prediction:
    """`predict_decode` of a `plan_budgets` result: the misses are copied over one link per GPU (and the CPU tier,
    which serves one GPU, computes none of them)."""
    links = replace(hardware, link_bps=hardware.link_bps * max(len(gpus), 1))
    return predict_decode(facts, placement, dtype_bytes, links, cpu_threads=0 if gpus else cpu_threads)
