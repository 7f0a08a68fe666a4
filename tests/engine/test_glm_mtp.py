"""GLM's MTP layer as a drafter, against its formula written out here:

    x = eh_proj(cat[enorm(embed(next_token)), hnorm(prev_hidden)]);  x = decoder_layer(x)
    logits = shared_head.head(shared_head.norm(x))

The decoder layer in the formula is transformers' own, built with one layer more than the target so that
it loads checkpoint layer `num_hidden_layers` (which transformers otherwise drops).
"""

import pytest
import torch
from safetensors.torch import load_file
from transformers import AutoConfig, AutoModelForCausalLM

from app.engine.loader import load_model
from app.errors import UserError
from app.model_folder import ModelFolder
from tests.fixtures.tiny_glm import VARIANTS, write_tiny_glm

LENGTH = 16  # longer than the tiny GLM-5's index_topk of 8: the MTP layer's own indexer drops tokens
TOLERANCE = {None: 1e-4, "compressed-tensors": 2e-3, "fp8": 2e-3}


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    return weight * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps))


def transformers_with_mtp_layer(folder):
    config = AutoConfig.from_pretrained(str(folder))
    config.num_hidden_layers += 1
    if getattr(config, "mlp_layer_types", None):
        config.mlp_layer_types = [*config.mlp_layer_types, "sparse"]
    if getattr(config, "indexer_types", None):
        config.indexer_types = [*config.indexer_types, "full"]
    return AutoModelForCausalLM.from_pretrained(
        str(folder), config=config, dtype=torch.float32, attn_implementation="eager"
    ).eval()


def formula(folder, hidden: torch.Tensor, next_tokens: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(logits [T, V], hidden before shared_head.norm [T, H]) for positions 0 … T-1."""
    ref = transformers_with_mtp_layer(folder)
    config = ref.config
    index = config.num_hidden_layers - 1
    tensors = {}
    for shard in folder.glob("*.safetensors"):
        tensors |= {name: tensor.float() for name, tensor in load_file(str(shard)).items()}
    p = f"model.layers.{index}."
    embed = tensors.get(p + "embed_tokens.weight", tensors["model.embed_tokens.weight"])
    head = tensors.get(p + "shared_head.head.weight", tensors["lm_head.weight"])
    eps = config.rms_norm_eps
    x = torch.cat((rms_norm(embed[next_tokens], tensors[p + "enorm.weight"], eps),
                   rms_norm(hidden, tensors[p + "hnorm.weight"], eps)), dim=-1) @ tensors[p + "eh_proj.weight"].T
    positions = torch.arange(len(x))[None]
    causal = torch.full((len(x), len(x)), float("-inf")).triu(1)[None, None]
    with torch.no_grad():
        out = ref.model.layers[index](x[None], attention_mask=causal, position_ids=positions,
                                      position_embeddings=ref.model.rotary_emb(x[None], positions))
    x = (out[0] if isinstance(out, tuple) else out)[0]
    return rms_norm(x, tensors[p + "shared_head.norm.weight"], eps) @ head.T, x


@pytest.mark.parametrize("variant", VARIANTS)
def test_mtp_drafts_match_the_formula_step_by_step(variant, tiny_glm, glm_oracle_folder):
    model = load_model(ModelFolder.open(tiny_glm(variant)), dtype="float32", context=64).model
    ids = torch.randint(6, 384, (LENGTH + 1,), generator=torch.Generator().manual_seed(2))
    with torch.inference_mode():
        last_layer = (model.config.num_hidden_layers - 1,)
        target_logits, hidden = model.forward(ids[:-1], model.new_kv_cache(64), capture=last_layer)
        target = AutoModelForCausalLM.from_pretrained(str(glm_oracle_folder(variant)), dtype=torch.float32)
        expected = target(ids[None, :-1], output_hidden_states=True)
        drafter = model.load_mtp()
        cache = drafter.new_kv_cache(32)
        split = LENGTH - 3
        steps = [drafter.draft(hidden[:split], ids[1 : split + 1], cache)]
        steps += [drafter.draft(hidden[i : i + 1], ids[i + 1 : i + 2], cache) for i in range(split, LENGTH)]
    logits, mtp_hidden = torch.cat([s[0] for s in steps]), torch.cat([s[1] for s in steps])
    expected_logits, expected_mtp_hidden = formula(glm_oracle_folder(variant), hidden, ids[1:])
    tolerance = TOLERANCE[VARIANTS[variant][2]]
    assert (hidden - expected.hidden_states[-1][0]).abs().max() <= tolerance  # what the target's LM head reads
    assert (target_logits - expected.logits[0]).abs().max() <= tolerance
    assert (logits - expected_logits).abs().max() <= tolerance
    assert (mtp_hidden - expected_mtp_hidden).abs().max() <= tolerance
    assert expected_logits.std() > 0.5


def test_mtp_cache_rewinds_like_the_target_cache(tiny_glm):
    model = load_model(ModelFolder.open(tiny_glm("glm_moe_dsa")), dtype="float32", context=64).model
    ids = torch.randint(6, 384, (LENGTH + 1,), generator=torch.Generator().manual_seed(4))
    with torch.inference_mode():
        _, hidden = model.forward(ids[:-1], model.new_kv_cache(64), capture=(model.config.num_hidden_layers - 1,))
        drafter = model.load_mtp()
        cache = drafter.new_kv_cache(32)
        logits, _ = drafter.draft(hidden, ids[1:], cache)
        cache.truncate(10)
        redrafted, _ = drafter.draft(hidden[10:], ids[11:], cache)
    assert cache.length == LENGTH
    assert torch.allclose(redrafted, logits[10:], atol=1e-5)


def test_a_checkpoint_without_its_mtp_layer_runs_and_says_mtp_is_unavailable(tmp_path):
    folder = write_tiny_glm(tmp_path / "no-mtp", "glm4_moe", mtp=False)
    loaded = load_model(ModelFolder.open(folder), dtype="float32", context=32)
    assert loaded.facts.mtp_weights == 0
    assert max(loaded.facts.moe_layers) < loaded.facts.num_layers
    with torch.inference_mode():
        assert loaded.model.forward(torch.tensor([7, 8, 9]), loaded.model.new_kv_cache(32)).shape == (3, 384)
    with pytest.raises(UserError, match=r"has no MTP layer \(model\.layers\.3\.eh_proj\.weight is missing\)"):
        loaded.model.load_mtp()
