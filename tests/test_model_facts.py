"""ModelFacts for GLM checkpoints: what one expert and one token cost, in the checkpoint's own format."""

import math
from pathlib import Path

import pytest

from app.model_folder import ModelFolder, TensorInfo
from app.plan import ModelFacts
from tests.fixtures.tiny_glm import GLM_4_5_AIR_CONFIG, GLM_4_5_FP8_CONFIG, VARIANTS, write_tiny_glm


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    root = tmp_path_factory.mktemp("facts")
    return {variant: write_tiny_glm(root / variant, variant) for variant in VARIANTS}


def expected_expert_bytes(config: dict, fp8: str | None) -> int:
    hidden, width = config["hidden_size"], config["moe_intermediate_size"]
    shapes = [(width, hidden), (width, hidden), (hidden, width)]
    if fp8 is None:
        return sum(2 * out * inputs for out, inputs in shapes)
    if fp8 == "compressed-tensors":
        return sum(out * inputs + 4 * out for out, inputs in shapes)
    b0, b1 = config["quantization_config"]["weight_block_size"]
    return sum(out * inputs + 4 * math.ceil(out / b0) * math.ceil(inputs / b1) for out, inputs in shapes)


def expected_kv_per_token(config: dict) -> int:
    layers = config["num_hidden_layers"]
    if config["model_type"] == "glm4_moe":
        return layers * 2 * config["num_key_value_heads"] * config["head_dim"]
    indexed = 0
    if config["model_type"] == "glm_moe_dsa":
        indexed = (config.get("indexer_types") or ["full"] * layers).count("full") * config["index_head_dim"]
    return layers * (config["kv_lora_rank"] + config["qk_rope_head_dim"]) + indexed


@pytest.mark.parametrize("variant", VARIANTS)
def test_glm_facts_read_from_the_headers(variant, folders):
    folder = ModelFolder.open(folders[variant])
    config, facts = folder.config, ModelFacts.from_folder(ModelFolder.open(folders[variant]))
    layers = config["num_hidden_layers"]
    assert facts.num_experts == config["n_routed_experts"] and facts.top_k == config["num_experts_per_tok"]
    assert facts.moe_layers == tuple(range(1, layers + 1))  # dense layer 0, then MoE; the MTP layer's experts too
    assert facts.expert_bytes == expected_expert_bytes(config, VARIANTS[variant][2])
    assert facts.expert_bytes_per_token == config["num_experts_per_tok"] * (layers - 1) * facts.expert_bytes
    assert facts.kv_per_token == expected_kv_per_token(config)
    assert facts.latent_attention == (config["model_type"] != "glm4_moe")  # GLM-4.5's attention is grouped-query


def test_the_mtp_layer_is_kept_apart_from_the_target(folders, tmp_path):
    with_mtp = ModelFacts.from_folder(ModelFolder.open(folders["glm4_moe_fp8"]))
    without = ModelFacts.from_folder(ModelFolder.open(write_tiny_glm(tmp_path / "no-mtp", "glm4_moe_fp8", mtp=False)))
    assert with_mtp.resident_weights == without.resident_weights
    assert without.mtp_weights == 0 < with_mtp.mtp_weights
    assert with_mtp.total_experts == without.total_experts + with_mtp.num_experts
    assert with_mtp.expert_bytes_per_token == without.expert_bytes_per_token


def test_a_glm_4_5_air_fp8_expert_is_17_3_mb_and_a_token_reads_8_per_layer():
    """The performance note of the GLM issue, from GLM-4.5-Air-FP8's real shapes (headers only)."""
    config = {**GLM_4_5_AIR_CONFIG, "quantization_config": GLM_4_5_FP8_CONFIG["quantization_config"]}
    hidden, width = config["hidden_size"], config["moe_intermediate_size"]
    tensors = {}

    def header(name: str, dtype: str, shape: tuple[int, ...], element_bytes: int) -> None:
        tensors[name] = TensorInfo(name, dtype, shape, Path("model.safetensors"), 0, element_bytes * math.prod(shape))

    for layer in range(1, config["num_hidden_layers"] + 1):  # layer 46 is the MTP layer
        for expert in range(config["n_routed_experts"]):
            for projection, shape in (("gate_proj", (width, hidden)), ("up_proj", (width, hidden)),
                                      ("down_proj", (hidden, width))):
                name = f"model.layers.{layer}.mlp.experts.{expert}.{projection}"
                header(f"{name}.weight", "F8_E4M3", shape, 1)
                header(f"{name}.weight_scale", "F32", (shape[0], 1), 4)
    facts = ModelFacts.from_folder(ModelFolder(Path("GLM-4.5-Air-FP8"), config, {}, tensors))
    assert facts.expert_bytes == 3 * 1408 * 4096 + 4 * (1408 + 1408 + 4096) == 17_329_152  # 17.3 MB
    assert facts.expert_weights == 3 * 1408 * 4096
    assert facts.total_experts == 46 * 128
    assert facts.expert_bytes_per_token == 8 * 45 * 17_329_152  # 6.2 GB per token with no cache hits
