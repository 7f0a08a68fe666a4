"""The routing replay that measures the expert cache's hit rates for the model card and the planner."""

import json
from collections import OrderedDict

import torch

from app.model_folder import ModelFolder
from app.paths import BUNDLED_MODELS, DEMO_MODEL
from app.plan import ROUTING_FILE, ModelFacts
from tools.demo.routing import ENGINE_POLICY, replayed_hit_rate

EXPERTS, TOP_K, LAYERS = 8, 2, 3


def skewed_picks(chats: int, tokens: int, seed: int) -> list[list[torch.Tensor]]:
    """Per chat, per layer: [tokens, TOP_K] distinct experts, expert 0 and 1 far more popular."""
    generator = torch.Generator().manual_seed(seed)
    weights = torch.tensor([8.0, 6.0] + [1.0] * (EXPERTS - 2))
    return [[torch.stack([torch.multinomial(weights, TOP_K, generator=generator) for _ in range(tokens)])
             for _ in range(LAYERS)] for _ in range(chats)]


def lru_hit_rate(picks, slots: int) -> float:
    """Least recently used first; like the engine, a layer's call never evicts an expert it needs itself."""
    cache: OrderedDict[tuple[int, int], None] = OrderedDict()
    hits = uses = 0
    for chat in picks:
        for token in range(len(chat[0])):
            for layer, rows in enumerate(chat):
                needed = sorted(rows[token].tolist())
                for expert in needed:
                    uses += 1
                    if (layer, expert) in cache:
                        hits += 1
                    elif len(cache) == slots:
                        del cache[next(key for key in cache if key[0] != layer or key[1] not in needed)]
                    cache[(layer, expert)] = None
                    cache.move_to_end((layer, expert))
    return hits / uses


def test_the_lru_replay_is_a_plain_lru_over_slots_times_layers_and_the_policy_beats_it_on_skewed_routing():
    picks = skewed_picks(chats=3, tokens=150, seed=0)
    for slots in (2, 3, 5):
        lru = replayed_hit_rate(picks, EXPERTS, slots, lru=True)
        assert lru == lru_hit_rate(picks, slots * LAYERS)
    assert replayed_hit_rate(picks, EXPERTS, 3) > replayed_hit_rate(picks, EXPERTS, 3, lru=True) + 0.02


def test_the_planner_reads_the_demo_cache_rates_measured_under_the_engines_policy():
    record = json.loads((DEMO_MODEL / ROUTING_FILE).read_text())
    routing = json.loads((BUNDLED_MODELS / "evaluation.json").read_text())["routing"]
    assert record["policy"] == routing["cache_hit_rate"]["policy"] == ENGINE_POLICY
    assert record["hit_rate"] == routing["cache_hit_rate"]["engine_policy"]
    facts = ModelFacts.from_folder(ModelFolder.open(DEMO_MODEL))
    assert facts.measured_hit_rates == tuple((int(slots) / facts.num_experts, rate)
                                             for slots, rate in record["hit_rate"].items())
