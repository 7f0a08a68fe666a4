"""Routing statistics of a trained GPT-OSS (transformers model): which experts each layer's router picks
for every token of some chats, and what that means for an expert cache.

- popularity: each expert's share of a layer's picks; skew = the largest share × E (1.0 when uniform),
  normalised entropy (1.0 when uniform), the share of the most popular quarter of the experts;
- reuse: the fraction of a token's k experts that the previous token of the same chat also used, against
  k / E for independent uniform routing;
- LRU hit rate of one layer's cache of `slots` experts replayed over the picks, against what the
  planner's uniform-routing model (`app.plan.expert_hit_rate`) predicts for the same slots.
"""

import math
from collections import OrderedDict

import torch

from app.plan import expert_hit_rate


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
            "lru_hit_rate": {slots: round(_lru_hit_rate(chosen, slots), 4) for slots in slot_counts},
        })
    mean = {key: round(sum(layer[key] for layer in per_layer) / layers, 4)
            for key in ("largest_share_times_experts", "normalised_entropy", "top_quarter_share",
                        "reuse_with_previous_token")}
    mean["lru_hit_rate"] = {slots: round(sum(layer["lru_hit_rate"][slots] for layer in per_layer) / layers, 4)
                            for slots in slot_counts}
    return {
        "tokens": sum(len(chat[0]) for chat in picks), "experts": experts, "top_k": top_k,
        "uniform_reuse": top_k / experts,
        "planner_uniform_hit_rate": {slots: round(expert_hit_rate(slots, experts, top_k), 4) for slots in slot_counts},
        "mean_over_layers": mean, "per_layer": per_layer,
    }


def _shared(rows: torch.Tensor, previous: torch.Tensor) -> int:
    """How many of each row's experts also appear in the previous row, summed."""
    return int((rows[:, :, None] == previous[:, None, :]).any(-1).sum())


def _lru_hit_rate(chats: list[torch.Tensor], slots: int) -> float:
    """One layer's cache, cold at the start of each chat; every pick is a use (a hit if cached)."""
    hits = uses = 0
    for rows in chats:
        cache: OrderedDict[int, None] = OrderedDict()
        for row in rows.tolist():
            for expert in row:
                uses += 1
                if expert in cache:
                    hits += 1
                    cache.move_to_end(expert)
                else:
                    cache[expert] = None
                    if len(cache) > slots:
                        cache.popitem(last=False)
    return hits / uses
