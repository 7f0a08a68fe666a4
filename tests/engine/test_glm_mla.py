"""What is particular to MLA (GLM-4.7-Flash, GLM-5) and DSA (GLM-5): the compressed-latent cache, and an
indexer that really drops tokens."""

import json
import shutil

import pytest
import torch

from app.engine.loader import load_model
from app.model_folder import ModelFolder
from tests.fixtures.tiny_glm import VARIANTS


def load(folder):
    return load_model(ModelFolder.open(folder), dtype="float32", context=64)


@pytest.mark.parametrize("variant", VARIANTS)
def test_the_engine_allocates_the_cache_the_plan_counted(variant, tiny_glm):
    loaded = load(tiny_glm(variant))
    cache = loaded.model.new_kv_cache(64)
    assert cache.nbytes == loaded.facts.kv_bytes_per_token(4) * 64
    assert loaded.placement.kv_cache_bytes == cache.nbytes


@pytest.mark.parametrize(("variant", "indexed_layers"), [
    ("glm4_moe_lite", 0), ("glm_moe_dsa", 2), ("glm_moe_dsa_fp8", 3),
])
def test_mla_caches_the_latent_and_rope_key_not_keys_and_values(variant, indexed_layers, tiny_glm):
    loaded = load(tiny_glm(variant))
    config = loaded.folder.config
    layers, latent = config["num_hidden_layers"], config["kv_lora_rank"] + config["qk_rope_head_dim"]
    shapes = {name: tuple(buffer.shape) for name, buffer in loaded.model.new_kv_cache(64).buffers.items()}
    expected = {"latent": (layers, 64, latent)}
    if indexed_layers:  # GLM-5.2's "shared" layers reuse a selection and keep no index keys
        expected["index_key"] = (indexed_layers, 64, config["index_head_dim"])
    assert shapes == expected
    full_kv = 2 * config["num_attention_heads"] * config["v_head_dim"]  # values alone, per token and layer
    assert latent < full_kv


def test_the_dsa_indexer_drops_tokens_once_the_prompt_is_longer_than_index_topk(tiny_glm, tmp_path):
    """The same weights with an index_topk above the prompt length attend to everything: the logits agree
    while a query sees at most index_topk tokens, and differ after."""
    sparse_folder = tiny_glm("glm_moe_dsa")
    dense_folder = shutil.copytree(sparse_folder, tmp_path / "dense")
    config = json.loads((dense_folder / "config.json").read_text())
    topk = config["index_topk"]
    (dense_folder / "config.json").write_text(json.dumps({**config, "index_topk": 64}))
    ids = torch.randint(6, 384, (24,), generator=torch.Generator().manual_seed(9))
    with torch.inference_mode():
        sparse, dense = (load(folder).model for folder in (sparse_folder, dense_folder))
        sparse_logits = sparse.forward(ids, sparse.new_kv_cache(64))
        dense_logits = dense.forward(ids, dense.new_kv_cache(64))
    difference = (sparse_logits - dense_logits).abs().amax(dim=-1)
    assert difference[:topk].max() < 1e-5
    assert difference[topk:].min() > 1e-2
