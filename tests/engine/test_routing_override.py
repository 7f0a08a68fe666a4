"""Routing overrides for benchmarks (routing_override.py): the experts each layer runs are the replayed or drawn
ones, weighted by the router's own scores, while look-ahead predictions still come from the router."""

import numpy as np
import pytest
import torch

from app.engine.experts.routing_override import ReplayedRouting, UniformRouting
from app.engine.loader import load_model
from app.engine.models.glm import route
from app.model_folder import ModelFolder


def recorded_routing(model) -> list[tuple]:
    """Every call of the model's expert cache: (layer, top_experts, top_weights, predictions)."""
    calls, run = [], model.experts.run

    def recording(layer, hidden, top_experts, top_weights, op, predictions=None, **given):
        calls.append((layer, top_experts.clone(), top_weights.clone(), dict(predictions or {})))
        return run(layer, hidden, top_experts, top_weights, op, predictions, **given)

    model.experts.run = recording
    return calls


def test_replayed_routing_runs_the_trace_weighted_by_the_router(tiny_gpt_oss):
    loaded = load_model(ModelFolder.open(tiny_gpt_oss), dtype="float32", context=32, prefetch_layers=1,
                        gpu_budget=None)
    model = loaded.model
    layers, experts, top_k = loaded.facts.moe_layers, loaded.facts.num_experts, loaded.facts.top_k
    trace = np.stack([np.stack([np.random.default_rng(t * 10 + i).permutation(experts)[:top_k] for i in layers])
                      for t in range(5)])  # [5 tokens, L, k]
    model.routing_override = ReplayedRouting(trace, layers, model.device)
    calls = recorded_routing(model)
    cache = model.new_kv_cache(16)
    with torch.inference_mode():
        model.forward(torch.tensor([3, 4, 5]), cache)  # rows 0-2
        model.forward(torch.tensor([6, 7, 8]), cache)  # rows 3, 4, then 0 again
    rows = [0, 1, 2, 3, 4, 0]
    for call_index, (layer, top_experts, top_weights, _) in enumerate(calls):
        pass_rows = rows[:3] if call_index < len(layers) else rows[3:]
        assert top_experts.tolist() == trace[pass_rows, layers.index(layer)].tolist()
        assert torch.allclose(top_weights.sum(-1), torch.ones(3))


def test_the_router_still_weights_replayed_experts_and_predicts_the_next_layers(tiny_gpt_oss):
    probe = load_model(ModelFolder.open(tiny_gpt_oss), dtype="float32", context=32).placement
    budget = probe.resident_bytes + probe.kv_cache_bytes + probe.workspace_bytes + 6 * probe.expert_bytes
    model = load_model(ModelFolder.open(tiny_gpt_oss), dtype="float32", context=32, gpu_budget=budget,
                       prefetch_layers=1).model
    experts = torch.tensor([[0, 1, 2, 3]])
    normed = torch.randn(1, model.config.hidden_size)
    layer = model.layers[0]

    class Fixed:
        def experts(self, index, num_tokens):
            return experts

    model.routing_override = Fixed()
    routing = model._routing(0, layer, normed)
    logits = torch.addmm(layer["router_bias"], normed, layer["router"].T)
    assert routing.top_experts.tolist() == experts.tolist()
    assert torch.allclose(routing.top_weights, torch.softmax(logits[:, :4], dim=-1))
    assert list(routing.predictions) == [1]  # the look-ahead reads the router, never the override
    assert routing.predictions[1].tolist() == model._route(model.layers[1], normed)[0].tolist()


@pytest.mark.parametrize("tokens", [1, 7])
def test_uniform_routing_draws_distinct_experts_of_the_layer(tokens):
    torch.manual_seed(0)
    draws = UniformRouting(8, 3, torch.device("cpu")).experts(0, tokens)
    assert draws.shape == (tokens, 3) and all(len(set(row)) == 3 for row in draws.tolist())
    assert ((draws >= 0) & (draws < 8)).all()
    spread = torch.cat([UniformRouting(8, 3, torch.device("cpu")).experts(0, 200).flatten() for _ in range(5)])
    assert torch.bincount(spread, minlength=8).min() > 0.7 * len(spread) / 8


def test_glm_routes_chosen_experts_with_its_normalised_scores(tiny_glm):
    loaded = load_model(ModelFolder.open(tiny_glm("glm4_moe")), dtype="float32", context=32)
    moe = next(iter(loaded.model.moe_layers.values()))
    x = torch.randn(2, loaded.model.config.hidden_size)
    chosen = torch.tensor([[0, 1], [2, 3]])[:, : moe.config.num_experts_per_tok]
    experts, weights = route(x, moe.router, moe.correction_bias, moe.config, chosen)
    scores = torch.sigmoid(x @ moe.router.T).gather(1, chosen)
    assert experts is chosen
    expected = scores / scores.sum(-1, keepdim=True) if moe.config.norm_topk_prob else scores
    assert torch.allclose(weights, expected * moe.config.routed_scaling_factor)
