"""The expert cache's hit rate while the engine itself generates on the demo model with its experts
offloaded: `load_model` with a budget of `slots` experts per layer, greedy answers to held-out prompts one
after another (the cache stays warm between them, as in the app), prompt prefill and decode both counted.
Run under plain LRU and under the engine's eviction policy (app/engine/experts/cache_policy.py)."""

import torch

from app.engine.experts.cache_policy import LRU_HALF_LIFE, DecayedUseEviction
from app.engine.generation.generate import generate
from app.engine.generation.sampling import Sampler, SamplingParams
from app.engine.loader import load_model
from app.engine.runner.step_runner import StepRunner
from app.model_folder import ModelFolder
from tools.demo.chat_data import STOP_IDS
from tools.demo.routing import ENGINE_POLICY


def engine_hit_rates(folder, prompts: list[list[int]], new_tokens: int, slot_counts: tuple[int, ...]) -> dict:
    rates = {"policy": ENGINE_POLICY, "prompts": len(prompts), "max_new_tokens": new_tokens, "lru": {},
             "engine_policy": {}}
    for slots in slot_counts:
        for name, lru in (("lru", True), ("engine_policy", False)):
            rates[name][slots] = round(_hit_rate(folder, prompts, new_tokens, slots, lru), 4)
            print(f"engine, {slots} experts per layer, {name}: hit rate {rates[name][slots]}", flush=True)
    return rates


def _hit_rate(folder, prompts, new_tokens: int, slots: int, lru: bool) -> float:
    context = max(len(p) for p in prompts) + new_tokens
    resident = load_model(ModelFolder.open(folder), dtype="float32", context=context)
    sizing, total_slots = resident.placement, slots * len(resident.facts.moe_layers)
    fixed = sizing.resident_bytes + sizing.kv_cache_bytes + sizing.workspace_bytes
    loaded = load_model(ModelFolder.open(folder), dtype="float32", context=context,
                        gpu_budget=fixed + total_slots * sizing.expert_bytes)
    model, cache = loaded.model, loaded.model.experts
    assert loaded.placement.expert_slots == total_slots, loaded.placement
    if lru:
        cache.eviction = DecayedUseEviction(LRU_HALF_LIFE)  # nothing is resident yet
    for prompt in prompts:
        for _ in generate(StepRunner(model, len(prompt) + new_tokens), prompt,
                          Sampler(SamplingParams(), torch.device("cpu")), new_tokens, STOP_IDS):
            pass
    return cache.snapshot().hit_rate
