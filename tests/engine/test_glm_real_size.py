"""The decode benchmark's GLM-4.5-Air-FP8 (bench/decode_glm.py) with its real routed experts: what
`write_real_size_glm` writes is the published format, the planner reads the real expert bytes from it, and the
engine loads it on the CPU with three quarters of the routed experts off the device and decodes."""

import json
from pathlib import Path

import pytest

from app.engine.loader import load_model
from app.model_folder import ModelFolder
from app.plan import ModelFacts
from bench.decode_gpt_oss import expert_budget
from tests.engine.greedy import our_greedy
from tests.fixtures.tiny_glm import GLM_4_5_AIR_FP8_CONFIG, GLM_4_5_FP8_CONFIG, write_real_size_glm

# one dense and one MoE layer with the real routed experts (hidden and expert widths); fewer attention heads, a
# narrower dense MLP and a small vocabulary keep the write and the CPU decode to seconds
REAL_EXPERTS = {**GLM_4_5_AIR_FP8_CONFIG, "num_hidden_layers": 2, "num_attention_heads": 8, "intermediate_size": 1408,
                "vocab_size": 1024}
EXPERT_BYTES = 3 * 1408 * 4096 + 4 * (1408 + 1408 + 4096)  # FP8 gate, up and down plus their F32 scales


@pytest.fixture(scope="module")
def folder(tmp_path_factory) -> Path:
    return write_real_size_glm(tmp_path_factory.mktemp("glm-air") / "model", REAL_EXPERTS)


def test_the_published_format_with_hollow_routed_experts(folder):
    config = json.loads((folder / "config.json").read_text())
    quantization = config.pop("quantization_config")
    assert config == {key: value for key, value in REAL_EXPERTS.items() if key != "quantization_config"}
    assert {**quantization, "ignore": []} == GLM_4_5_FP8_CONFIG["quantization_config"]
    ignore, tensors = set(quantization["ignore"]), ModelFolder.open(folder).tensors
    assert {"lm_head", "model.embed_tokens", "model.layers.1.mlp.gate", "model.layers.0.self_attn.q_proj.bias",
            "model.layers.1.mlp.gate.e_score_correction_bias", "model.layers.0.input_layernorm"} <= ignore
    for name, info in tensors.items():
        module = name.removesuffix(".weight")
        if name.endswith(".weight_scale"):
            weight = tensors[name.replace(".weight_scale", ".weight")]
            assert (info.dtype, info.shape) == ("F32", (weight.shape[0], 1)), name
        elif name.endswith(".weight") and module not in ignore:
            assert info.dtype == "F8_E4M3" and f"{module}.weight_scale" in tensors, name
        else:
            assert module in ignore or name.removesuffix(".bias") + ".bias" in ignore or module.rpartition(".")[0] \
                in ignore, name
            assert info.dtype in ("BF16", "F32") and f"{module}.weight_scale" not in tensors, name
    expert_file = tensors["model.layers.1.mlp.experts.127.down_proj.weight"].file
    assert expert_file.stat().st_size > 128 * EXPERT_BYTES > 100 * 512 * expert_file.stat().st_blocks  # a hole


def test_the_planner_reads_the_real_expert_bytes(folder):
    facts = ModelFacts.from_folder(ModelFolder.open(folder))
    assert facts.expert_bytes == EXPERT_BYTES == 17_329_152
    assert (facts.moe_layers, facts.num_experts, facts.top_k) == ((1,), 128, 8)


def test_the_engine_decodes_it_with_a_quarter_of_the_experts_on_the_device(folder):
    facts = ModelFacts.from_folder(ModelFolder.open(folder))
    context = 8
    # RAM budget 0: misses are read from the checkpoint (copying 2.2 GB of experts into RAM first costs CI seconds)
    loaded = load_model(ModelFolder.open(folder), dtype="float32", context=context, ram_budget=0,
                        gpu_budget=expert_budget(facts, 0.25, context, dtype_bytes=4))
    assert loaded.placement.expert_slots == 32
    tokens = our_greedy(loaded, [5, 17, 900, 3], 3)
    assert len(tokens) == 3 and all(0 <= token < 1024 for token in tokens)
    cache = loaded.model.experts.snapshot()
    # the random router spreads the 6 tokens through the MoE layer over the experts: most of their 48 picks miss
    # (29 here; a router drawn at the tiny models' fixed scale, whose sigmoid saturates at this width, misses 20)
    assert cache.misses > 3 * 8 and cache.bytes_fetched == cache.misses * EXPERT_BYTES
