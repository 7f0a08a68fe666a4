"""Every GLM architecture (glm4_moe, glm4_moe_lite, glm_moe_dsa; bf16 and both FP8 formats) against the
transformers implementation loaded from the same folder in float32 (for FP8: from a float32 copy with the
same dequantized weights, see conftest.py)."""

import pytest
import torch
from transformers import AutoModelForCausalLM

from app.engine.loader import load_model
from app.model_folder import ModelFolder
from tests.engine.greedy import our_greedy, prompt_and_decode_logits, reference_greedy, rewound_and_fresh_logits
from tests.fixtures.tiny_glm import VARIANTS

PROMPT_LENGTH = 20  # longer than the tiny GLM-5's index_topk of 8: the DSA indexer drops tokens
NEW_TOKENS = 32
TOLERANCE = {None: 1e-4, "compressed-tensors": 2e-3, "fp8": 2e-3}


def prompt(seed: int) -> list[int]:
    return torch.randint(6, 384, (PROMPT_LENGTH,), generator=torch.Generator().manual_seed(seed)).tolist()


def reference(folder):
    return AutoModelForCausalLM.from_pretrained(str(folder), dtype=torch.float32).eval()


def load(folder, **options):
    return load_model(ModelFolder.open(folder), dtype="float32", context=64, **options)


@pytest.mark.parametrize("variant", VARIANTS)
def test_logits_match_transformers_on_prompt_and_decode_steps(variant, tiny_glm, glm_oracle_folder):
    ref = reference(glm_oracle_folder(variant))
    model = load(tiny_glm(variant)).model
    ours, expected = prompt_and_decode_logits(model, ref, prompt(7), 6)
    assert ours.shape == expected.shape
    assert (ours - expected).abs().max() <= TOLERANCE[VARIANTS[variant][2]]
    assert expected.std() > 0.5  # the comparison is not between near-constant logits


@pytest.mark.parametrize("variant", VARIANTS)
def test_32_greedy_tokens_match_transformers(variant, tiny_glm, glm_oracle_folder):
    ids = prompt(11)
    expected = reference_greedy(reference(glm_oracle_folder(variant)), ids, NEW_TOKENS)
    assert our_greedy(load(tiny_glm(variant)), ids, NEW_TOKENS) == expected
    assert len(set(expected)) > 4  # a degenerate repeat would prove little


@pytest.mark.parametrize("variant", VARIANTS)
def test_offloaded_experts_give_the_resident_tokens(variant, tiny_glm):
    ids = prompt(3)
    resident = load(tiny_glm(variant))
    placement = resident.placement
    fixed = placement.resident_bytes + placement.kv_cache_bytes + placement.workspace_bytes
    offloaded = load(tiny_glm(variant), gpu_budget=fixed + 3 * placement.expert_bytes)
    assert offloaded.placement.expert_slots == 3
    tokens = our_greedy(resident, ids, NEW_TOKENS)
    assert our_greedy(offloaded, ids, NEW_TOKENS) == tokens
    stats = offloaded.model.experts.stats
    assert stats.misses > NEW_TOKENS  # most steps fetch experts
    assert stats.bytes_fetched == (stats.misses + stats.prefetches) * offloaded.facts.expert_bytes
    assert resident.model.experts.stats.misses == 0


@pytest.mark.parametrize("variant", VARIANTS)
def test_truncate_rewinds_the_cache_exactly(variant, tiny_glm):
    """After a rewind, re-fed tokens give what a fresh cache gives: the speculation rewind, MLA latents
    and DSA index keys included."""
    ids = torch.tensor(prompt(5))
    rewound, fresh, length = rewound_and_fresh_logits(load(tiny_glm(variant)).model, ids)
    assert length == len(ids) + 2
    assert torch.allclose(rewound, fresh, atol=1e-5)
