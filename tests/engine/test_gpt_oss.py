"""Our GPT-OSS against transformers.GptOssForCausalLM loaded from the same folder, in float32."""

import pytest
import torch
from transformers import GptOssForCausalLM

from app.engine.experts.cache_policy import DEFAULT_HALF_LIFE_SLOTS, DecayedUseEviction
from app.engine.loader import load_model
from app.model_folder import ModelFolder
from tests.engine.greedy import our_greedy, prompt_and_decode_logits, reference_greedy
from tests.fixtures.tiny_gpt_oss import write_tiny_gpt_oss
from tools.demo.target import load_target

PROMPT_LENGTH = 20  # longer than the tiny model's sliding window of 8
NEW_TOKENS = 32


def prompt(seed: int = 7) -> list[int]:
    return torch.randint(3, 384, (PROMPT_LENGTH,), generator=torch.Generator().manual_seed(seed)).tolist()


def reference(folder) -> GptOssForCausalLM:
    return load_target(folder, torch.device("cpu"))


@pytest.fixture(params=["mxfp4", "dense"])
def checkpoint(request, tiny_gpt_oss, tiny_gpt_oss_dense):
    return tiny_gpt_oss if request.param == "mxfp4" else tiny_gpt_oss_dense


def test_logits_match_transformers_on_prompt_and_decode_steps(checkpoint):
    ref = reference(checkpoint)
    model = load_model(ModelFolder.open(checkpoint), dtype="float32", context=64).model
    ours, expected = prompt_and_decode_logits(model, ref, prompt(), 6)
    assert ours.shape == expected.shape
    assert (ours - expected).abs().max() <= 1e-4
    assert expected.std() > 0.5  # the comparison is not between near-constant logits


def test_32_greedy_tokens_match_transformers(checkpoint):
    ids = prompt(11)
    expected = reference_greedy(reference(checkpoint), ids, NEW_TOKENS)
    ours = our_greedy(load_model(ModelFolder.open(checkpoint), dtype="float32", context=64), ids, NEW_TOKENS)
    assert ours == expected
    assert len(set(expected)) > 4  # a degenerate repeat would prove little


def test_offloaded_experts_give_identical_tokens_and_the_misses_routing_implies(tiny_gpt_oss):
    ids = prompt(3)
    resident = load_model(ModelFolder.open(tiny_gpt_oss), dtype="float32", context=64)
    offloaded = load_model(ModelFolder.open(tiny_gpt_oss), dtype="float32", context=64,
                           gpu_budget=_budget_for_slots(resident, 3), prefetch_layers=0)
    assert offloaded.placement.expert_slots == 3
    tokens = our_greedy(resident, ids, NEW_TOKENS)
    assert our_greedy(offloaded, ids, NEW_TOKENS) == tokens
    assert resident.model.experts.stats.misses == 0

    misses = _replayed_misses(_routing(tiny_gpt_oss, ids, tokens), slots=3)
    stats = offloaded.model.experts.stats
    assert stats.misses == misses
    assert stats.misses > NEW_TOKENS  # most steps miss
    assert stats.bytes_fetched == misses * _mxfp4_expert_bytes(offloaded.folder.config)


def test_look_ahead_prefetch_keeps_tokens_and_reports_true_coverage_and_waste(tiny_gpt_oss):
    """Coverage and waste recomputed from transformers' own hidden states and routers: layer m is
    predicted from the post-attention norm output of layer m - 1 (decode steps only)."""
    ids = prompt(9)
    resident = load_model(ModelFolder.open(tiny_gpt_oss), dtype="float32", context=64)
    prefetching = load_model(ModelFolder.open(tiny_gpt_oss), dtype="float32", context=64,
                             gpu_budget=_budget_for_slots(resident, 6), prefetch_layers=1)
    tokens = our_greedy(resident, ids, 16)
    assert our_greedy(prefetching, ids, 16) == tokens

    ref = reference(tiny_gpt_oss)
    normed = []
    hooks = [layer.post_attention_layernorm.register_forward_hook(lambda _m, _i, out: normed.append(out[0]))
             for layer in ref.model.layers]
    with torch.no_grad():
        ref(torch.tensor([ids + tokens[:-1]]))
    for hook in hooks:
        hook.remove()
    routers = [layer.mlp.router for layer in ref.model.layers]
    top_k = ref.config.num_experts_per_tok
    hit = predicted = used = 0
    for position in range(len(ids), len(ids) + len(tokens) - 1):
        for layer in range(1, len(routers)):
            guess = set(_router_logits(routers[layer], normed[layer - 1][position]).topk(top_k).indices.tolist())
            truth = set(_router_logits(routers[layer], normed[layer][position]).topk(top_k).indices.tolist())
            hit, predicted, used = hit + len(guess & truth), predicted + len(guess), used + len(truth)
    stats = prefetching.model.experts.snapshot().as_dict()
    assert stats["prefetches"] > 0
    assert stats["prefetch_coverage"] == pytest.approx(hit / used)
    assert stats["prefetch_waste"] == pytest.approx(1 - hit / predicted)
    assert 0 < stats["prefetch_coverage"] < 1


def test_experts_read_from_disk_past_the_ram_budget_give_identical_tokens(tiny_gpt_oss):
    ids = prompt(5)
    resident = load_model(ModelFolder.open(tiny_gpt_oss), dtype="float32", context=64)
    expert_bytes = _mxfp4_expert_bytes(resident.folder.config)
    from_disk = load_model(ModelFolder.open(tiny_gpt_oss), dtype="float32", context=64,
                           gpu_budget=_budget_for_slots(resident, 4), ram_budget=5 * expert_bytes)
    assert from_disk.placement.host_experts == 5
    assert our_greedy(from_disk, ids, 12) == our_greedy(resident, ids, 12)
    assert from_disk.model.experts.stats.disk_reads > 0


def _router_logits(router, hidden):
    return hidden @ router.weight.T + router.bias


def _budget_for_slots(loaded, slots: int) -> int:
    placement = loaded.placement
    fixed = placement.resident_bytes + placement.kv_cache_bytes + placement.workspace_bytes
    return fixed + slots * placement.expert_bytes


def _mxfp4_expert_bytes(config: dict) -> int:
    hidden, width = config["hidden_size"], config["intermediate_size"]
    gate_up = 2 * width * hidden // 2 + 2 * width * hidden // 32 + 2 * width * 2  # codes, scales, bf16 bias
    down = hidden * width // 2 + hidden * width // 32 + hidden * 2
    return gate_up + down


def _routing(folder, prompt_ids: list[int], generated: list[int]) -> list[list[list[int]]]:
    """Per forward call of the engine (the prompt, then one per fed token), per layer, the sorted
    set of experts that transformers' routers pick."""
    ref = reference(folder)
    fed = prompt_ids + generated[:-1]
    with torch.no_grad():
        router_logits = ref(torch.tensor([fed]), output_router_logits=True).router_logits
    top_k = ref.config.num_experts_per_tok
    chosen = [logits.reshape(len(fed), -1).topk(top_k, dim=-1).indices for logits in router_logits]
    calls = [range(len(prompt_ids))] + [[p] for p in range(len(prompt_ids), len(fed))]
    return [[sorted({int(e) for p in positions for e in layer[p]}) for layer in chosen] for positions in calls]


def _replayed_misses(routing, slots: int) -> int:
    """The routing replayed through the cache's eviction policy, outside the cache."""
    eviction = DecayedUseEviction(DEFAULT_HALF_LIFE_SLOTS * slots)
    resident: set[tuple[int, int]] = set()
    misses = 0
    for call in routing:
        for layer, experts in enumerate(call):
            for expert in experts:
                key = (layer, expert)
                if key not in resident:
                    misses += 1
                    if len(resident) == slots:
                        resident.remove(eviction.victim(keep={(layer, e) for e in experts}))
                    resident.add(key)
                eviction.used(key)
    return misses


def test_an_attention_width_other_than_the_hidden_size_matches_transformers(tmp_path):
    """gpt-oss-20b projects its 2880-wide hidden state to 64 heads × 64 = 4096 query features; the tiny
    models are square (4 × 16 = 64), so this one is not: hidden 96, queries 64 wide."""
    folder = write_tiny_gpt_oss(tmp_path / "wide", hidden_size=96)
    model = load_model(ModelFolder.open(folder), dtype="float32", context=64).model
    assert model.config.hidden_size != model.config.num_attention_heads * model.config.head_dim
    ours, expected = prompt_and_decode_logits(model, reference(folder), prompt(5), 6)
    assert (ours - expected).abs().max() <= 1e-4
    assert expected.std() > 0.5
