"""A batched pass over blocks of several sequences (each model's `forward_batch`) against each sequence's own
forward pass: the same logits and captured features, each cache advanced by its block (float32, CPU)."""

import pytest
import torch

from app.engine.loader import load_model
from app.model_folder import ModelFolder

# (model, captured layers): GPT-OSS reads features of three layers (a DFlash drafter's), GLM its last (MTP)
CASES = [("gpt_oss", (0, 2, 3)), ("glm4_moe", (2,)), ("glm_moe_dsa", (0, 1, 3))]


@pytest.mark.parametrize(("name", "capture"), CASES, ids=[name for name, _ in CASES])
def test_blocks_of_several_sequences_give_each_sequences_own_forward(name, capture, tiny_gpt_oss, tiny_glm):
    folder = tiny_gpt_oss if name == "gpt_oss" else tiny_glm(name)
    model = load_model(ModelFolder.open(folder), dtype="float32", context=64).model
    prompts = [list(range(40, 52)), list(range(7, 30)), [3]]
    blocks = [torch.tensor(block) for block in ([5, 6, 7], [9], [11, 12, 13, 14, 15])]
    with torch.inference_mode():
        batched_caches, own_caches = ([model.new_kv_cache(48) for _ in prompts] for _ in range(2))
        for prompt, batched, own in zip(prompts, batched_caches, own_caches, strict=True):
            for cache in (batched, own):
                model.forward(torch.tensor(prompt), cache)
        logits, features = model.forward_batch(blocks, batched_caches, capture=capture)
        expected = [model.forward(block, cache, capture=capture) for block, cache in zip(blocks, own_caches,
                                                                                            strict=True)]
    expected_logits, expected_features = (torch.cat(parts) for parts in zip(*expected, strict=True))
    assert logits.shape == expected_logits.shape == (9, model.config.vocab_size)
    assert (logits - expected_logits).abs().max() <= 1e-4 * expected_logits.abs().max()
    assert (features - expected_features).abs().max() <= 1e-4 * expected_features.abs().max()
    assert [cache.length for cache in batched_caches] == [cache.length for cache in own_caches] == [15, 24, 6]
