"""FP8 GLM checkpoints as stored: routed experts stay FP8 (with their scales) in the store and the cache,
and damaged or unsupported quantization is one clear UserError, never a crash."""

import json
import math
import shutil

import pytest
import torch
from safetensors.torch import load_file, save_file

from app.engine.loader import load_model
from app.errors import UserError
from app.model_folder import ModelFolder

INDEX = "model.safetensors.index.json"


def load(folder, **options):
    return load_model(ModelFolder.open(folder), dtype="float32", context=32, **options)


def rewrite_tensors(folder, change) -> None:
    """Apply `change(tensors) -> tensors` to every shard's tensors and rewrite the index to match."""
    weight_map = {}
    for shard in sorted(folder.glob("*.safetensors")):
        tensors = change(load_file(str(shard)))
        save_file(tensors, str(shard), metadata={"format": "pt"})
        weight_map |= dict.fromkeys(tensors, shard.name)
    index = json.loads((folder / INDEX).read_text())
    (folder / INDEX).write_text(json.dumps({**index, "weight_map": weight_map}))


def edit_config(folder, **changes) -> None:
    config = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**config, **changes}))


@pytest.mark.parametrize(("variant", "scale", "scale_shape"), [
    ("glm4_moe_fp8", "weight_scale", lambda out, inputs: (out, 1)),
    ("glm_moe_dsa_fp8", "weight_scale_inv", lambda out, inputs: (math.ceil(out / 32), math.ceil(inputs / 32))),
])
def test_routed_experts_stay_fp8_with_their_scales_in_the_store_and_the_cache(variant, scale, scale_shape, tiny_glm):
    loaded = load(tiny_glm(variant), gpu_budget=None)
    config = loaded.folder.config
    hidden, width = config["hidden_size"], config["moe_intermediate_size"]
    shapes = {"gate_proj": (width, hidden), "up_proj": (width, hidden), "down_proj": (hidden, width)}
    arenas = loaded.model.experts.arenas
    slots = loaded.placement.expert_slots
    expected = {}
    for projection, shape in shapes.items():
        expected[f"{projection}.weight"] = (torch.float8_e4m3fn, (slots, *shape))
        expected[f"{projection}.{scale}"] = (torch.float32, (slots, *scale_shape(*shape)))
    assert {name: (arena.dtype, tuple(arena.shape)) for name, arena in arenas.items()} == expected
    expert_bytes = sum(math.prod(shape[1:]) * (1 if dtype == torch.float8_e4m3fn else 4)
                       for dtype, shape in expected.values())
    assert loaded.facts.expert_bytes == loaded.model.experts.store.expert_bytes == expert_bytes


def test_an_fp8_scale_of_the_wrong_shape_is_one_clear_error(tiny_glm, tmp_path):
    folder = shutil.copytree(tiny_glm("glm_moe_dsa_fp8"), tmp_path / "model")
    name = "model.layers.1.mlp.experts.3.down_proj.weight_scale_inv"
    rewrite_tensors(folder, lambda tensors: {**tensors, name: torch.ones(3, 2)} if name in tensors else tensors)
    with pytest.raises(UserError) as error:
        load(folder)
    assert str(error.value) == (
        f"FP8 scale '{name}' has shape [3, 2] but a [64, 64] weight with 32×32 blocks needs [2, 2]: "
        "the weights do not match config.json"
    )


def test_a_per_channel_scale_of_the_wrong_shape_is_one_clear_error(tiny_glm, tmp_path):
    folder = shutil.copytree(tiny_glm("glm4_moe_fp8"), tmp_path / "model")
    name = "model.layers.0.self_attn.q_proj.weight_scale"
    rewrite_tensors(folder, lambda tensors: {**tensors, name: torch.ones(64)} if name in tensors else tensors)
    with pytest.raises(UserError, match=r"FP8 scale '.*q_proj\.weight_scale' has shape \[64\] but a \[64, 64\] "
                                        r"weight with one scale per output channel needs \[64, 1\]"):
        load(folder)


@pytest.mark.parametrize(("quantization", "message"), [
    ({"quant_method": "awq", "bits": 4}, "quantization method 'awq' in .* is not supported; supported: mxfp4"),
    ({"quant_method": "compressed-tensors", "format": "pack-quantized", "config_groups": {"group_0": {
        "weights": {"type": "int", "num_bits": 4, "strategy": "group"}}}},
     r"compressed-tensors format 'pack-quantized' \(int 4-bit per group\) .* is not supported"),
    ({"quant_method": "fp8", "fmt": "e4m3"}, "describes fp8 weights as fmt 'e4m3' with weight_block_size None"),
])
def test_an_unsupported_quantization_is_refused_when_the_folder_opens(quantization, message, tiny_glm, tmp_path):
    folder = shutil.copytree(tiny_glm("glm4_moe_fp8"), tmp_path / "model")
    edit_config(folder, quantization_config=quantization)
    with pytest.raises(UserError, match=message):
        ModelFolder.open(folder)


def test_fp8_weights_without_a_quantization_config_are_refused(tiny_glm, tmp_path):
    folder = shutil.copytree(tiny_glm("glm4_moe_fp8"), tmp_path / "model")
    config = json.loads((folder / "config.json").read_text())
    del config["quantization_config"]
    (folder / "config.json").write_text(json.dumps(config))
    with pytest.raises(UserError, match=r"is FP8 but config\.json declares no FP8 quantization_config"):
        load(folder)


def test_routed_experts_in_two_formats_are_refused(tiny_glm, tmp_path):
    folder = shutil.copytree(tiny_glm("glm4_moe_fp8"), tmp_path / "model")
    prefix = "model.layers.2.mlp.experts.5.up_proj."

    def to_bf16(tensors):
        if prefix + "weight" not in tensors:
            return tensors
        bf16 = (tensors[prefix + "weight"].float() * tensors.pop(prefix + "weight_scale")).to(torch.bfloat16)
        return {**tensors, prefix + "weight": bf16}

    rewrite_tensors(folder, to_bf16)
    with pytest.raises(UserError, match=r"expert 5 of layer 2 is stored as .* but expert 0 of layer 1 as .*: every "
                                        r"routed expert must have one format"):
        load(folder)
