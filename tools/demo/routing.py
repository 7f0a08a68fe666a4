"""Routing statistics of a trained GPT-OSS (transformers model): which experts each layer's router picks
for every token of some chats, and what that means for an expert cache.

- popularity: each expert's share of a layer's picks; skew = the largest share × E (1.0 when uniform),
  normalised entropy (1.0 when uniform), the share of the most popular quarter of the experts;
- reuse: the fraction of a token's k experts that the previous token of the same chat also used, against
  k / E for independent uniform routing;
- hit rates of the engine's `ExpertCache` of `slots` experts per layer (slots × layers in all, shared by
  the layers as in the engine) replayed over the picks token by token, chats one after another, under
  plain LRU and under the engine's eviction policy (app/engine/experts/cache_policy.py), against what the
  planner's uniform-routing model (`app.plan.expert_hit_rate`) predicts for the same slots.
"""

import math

import torch

from app.engine.experts.cache import ExpertCache
from app.engine.experts.cache_policy import DEFAULT_HALF_LIFE_SLOTS, LRU_HALF_LIFE, DecayedUseEviction
from app.engine.experts.store import ExpertStore
from app.plan import expert_hit_rate

ENGINE_POLICY = f"decayed use (app/engine/experts/cache_policy.py), half-life {DEFAULT_HALF_LIFE_SLOTS:g} × slots"


@torch.no_grad()
def router_picks(model, chats: list[list[int]]) -> list[list[torch.Tensor]]:
    """Per chat, per layer: the experts picked for each token, [T, k]."""
    picks: list[list[torch.Tensor]] = []
    current: list[torch.Tensor] = []
    hooks = [layer.mlp.router.register_forward_hook(lambda _m, _i, out: current.append(out[-1].cpu()))
             for layer in model.model.layers]
    try:
        for ids in chats:
            current.clear()
            model(input_ids=torch.tensor([ids], device=model.device))
            picks.append(list(current))
    finally:
        for hook in hooks:
            hook.remove()
    return picks


def routing_statistics(picks: list[list[torch.Tensor]], experts: int, slot_counts: tuple[int, ...]) -> dict:
    layers, top_k = len(picks[0]), picks[0][0].shape[-1]
    per_layer = []
    for layer in range(layers):
        chosen = [chat[layer] for chat in picks]
        counts = torch.bincount(torch.cat(chosen).flatten(), minlength=experts).double()
        shares = counts / counts.sum()
        entropy = -(shares[shares > 0] * shares[shares > 0].log()).sum().item() / math.log(experts)
        reused = sum(_shared(rows[1:], rows[:-1]) for rows in chosen)
        pairs = sum(len(rows) - 1 for rows in chosen)
        per_layer.append({
            "largest_share_times_experts": round(shares.max().item() * experts, 3),
            "normalised_entropy": round(entropy, 4),
            "top_quarter_share": round(shares.sort(descending=True).values[: max(1, experts // 4)].sum().item(), 4),
            "reuse_with_previous_token": round(reused / (pairs * top_k), 4),
        })
    mean = {key: round(sum(layer[key] for layer in per_layer) / layers, 4)
            for key in ("largest_share_times_experts", "normalised_entropy", "top_quarter_share",
                        "reuse_with_previous_token")}
    return {
        "tokens": sum(len(chat[0]) for chat in picks), "experts": experts, "top_k": top_k,
        "uniform_reuse": top_k / experts,
        "planner_uniform_hit_rate": {slots: round(expert_hit_rate(slots, experts, top_k), 4) for slots in slot_counts},
        "cache_hit_rate": {
            "policy": ENGINE_POLICY,
            "lru": {slots: round(replayed_hit_rate(picks, experts, slots, lru=True), 4) for slots in slot_counts},
            "engine_policy": {slots: round(replayed_hit_rate(picks, experts, slots), 4) for slots in slot_counts},
        },
        "mean_over_layers": mean, "per_layer": per_layer,
    }


def _shared(rows: torch.Tensor, previous: torch.Tensor) -> int:
    """How many of each row's experts also appear in the previous row, summed."""
    return int((rows[:, :, None] == previous[:, None, :]).any(-1).sum())


def bookkeeping_cache(layers: int, experts: int, slots: int, lru: bool = False) -> ExpertCache:
    """An `ExpertCache` of `slots` slots over one-byte experts on the CPU: the engine's hits, misses and
    eviction bookkeeping with nothing worth copying; under plain LRU instead of its own policy if `lru`."""
    store = ExpertStore(lambda _layer, _expert: {"id": torch.zeros(1, dtype=torch.uint8)}, tuple(range(layers)),
                        experts, host_experts=layers * experts, pin=False)
    cache = ExpertCache(store, slots, torch.device("cpu"))
    if lru:
        cache.eviction = DecayedUseEviction(LRU_HALF_LIFE)
    return cache


def replayed_hit_rate(picks: list[list[torch.Tensor]], experts: int, slots: int, lru: bool = False) -> float:
    """The picks of every token, layer by layer, through an `ExpertCache` of `slots` × layers slots,
    warm from one chat to the next; every pick is a use."""
    layers = len(picks[0])
    cache = bookkeeping_cache(layers, experts, slots * layers, lru)
    for chat in picks:
        rows = [layer.tolist() for layer in chat]
        for token in range(len(rows[0])):
            for layer in range(layers):
                cache.ensure(layer, sorted(rows[layer][token]))
    return cache.stats.hit_rate
