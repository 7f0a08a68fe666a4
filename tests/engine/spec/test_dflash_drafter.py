"""The DFlash drafter: target features captured as transformers' hidden_states[l + 1], drafts equal to a
formula-level re-computation from models.md, and one clear error per way a drafter does not fit."""

import json
import shutil

import pytest
import torch
from safetensors.torch import load_file

from app.engine.generation.sampling import Sampler, SamplingParams
from app.engine.spec.dflash import DFlashProposer, DFlashSpeculation
from app.errors import UserError
from tests.fixtures.tiny_dflash import write_tiny_dflash
from tools.demo.target import load_target

PROMPT = [7, 41, 99, 3, 250, 17, 64, 128, 5, 77, 31, 200, 12, 9, 160, 45, 88, 301, 2, 19]  # longer than the window


def target_config(folder) -> dict:
    return json.loads((folder / "config.json").read_text())


@pytest.fixture(scope="module")
def reference_hidden_states(tiny_gpt_oss):
    """transformers' hidden_states (index 0: embeddings, l + 1: output of layer l), its embedding and LM head."""
    model = load_target(tiny_gpt_oss, torch.device("cpu"))
    with torch.no_grad():
        out = model(torch.tensor([PROMPT]), output_hidden_states=True)
    return [h[0] for h in out.hidden_states], model.model.embed_tokens.weight, model.lm_head.weight


def test_forward_captures_exactly_the_listed_layer_outputs(resident_target, reference_hidden_states):
    hidden_states, _, _ = reference_hidden_states
    layers = (2, 0, 3)  # any order: concatenated as listed
    with torch.inference_mode():
        logits, features = resident_target.forward(torch.tensor(PROMPT), resident_target.new_kv_cache(64),
                                                   capture=layers)
        plain = resident_target.forward(torch.tensor(PROMPT), resident_target.new_kv_cache(64))
    expected = torch.cat([hidden_states[layer + 1] for layer in layers], dim=-1)
    assert features.shape == (len(PROMPT), 3 * 64)
    assert (features - expected).abs().max() <= 1e-4
    assert not torch.allclose(features[:, :64], hidden_states[2])  # off by one would be caught
    assert torch.equal(logits, plain)


def reference_draft_logits(drafter_folder, features, block, embed, lm_head) -> torch.Tensor:
    """models.md's drafter, written out: c = hidden_norm(fc(feature)); per layer queries from the block
    only, keys/values = cat[k_proj(c), k_proj(norm(h_block))], q/k RMSNorm per head, RoPE on q (block
    positions) and on all keys (context + block positions), no mask; logits of positions 1 … B - 1."""
    config = target_config(drafter_folder)
    stored = load_file(str(drafter_folder / "model.safetensors"))
    w = {name.removeprefix("model."): t.float() for name, t in stored.items()}
    heads, kv_heads, head_dim = config["num_attention_heads"], config["num_key_value_heads"], config["head_dim"]
    eps, theta = config["rms_norm_eps"], config["rope_theta"]

    def norm(x, weight):
        return weight * x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps)

    def rope(x, positions):  # x [T, heads, d], rotate_half convention
        inv_freq = 1.0 / theta ** (torch.arange(0, head_dim, 2).float() / head_dim)
        angles = positions.float()[:, None] * inv_freq
        cos, sin = torch.cat([angles, angles], -1).cos()[:, None], torch.cat([angles, angles], -1).sin()[:, None]
        half = head_dim // 2
        rotated = torch.cat([-x[..., half:], x[..., :half]], -1)
        return x * cos + rotated * sin

    context_length, size = len(features), len(block)
    context_positions = torch.arange(context_length)
    block_positions = torch.arange(context_length, context_length + size)
    c = norm(features @ w["fc.weight"].T, w["hidden_norm.weight"])
    h = embed[torch.tensor(block)]
    for i in range(config["num_hidden_layers"]):
        p = f"layers.{i}."
        x = norm(h, w[p + "input_layernorm.weight"])
        q = norm((x @ w[p + "self_attn.q_proj.weight"].T).view(size, heads, head_dim), w[p + "self_attn.q_norm.weight"])
        k = torch.cat([c, x]) @ w[p + "self_attn.k_proj.weight"].T
        k = norm(k.view(-1, kv_heads, head_dim), w[p + "self_attn.k_norm.weight"])
        v = (torch.cat([c, x]) @ w[p + "self_attn.v_proj.weight"].T).view(-1, kv_heads, head_dim)
        q = rope(q, block_positions)
        k = rope(k, torch.cat([context_positions, block_positions]))
        out = torch.empty(size, heads, head_dim)
        for head in range(heads):
            kv = head // (heads // kv_heads)
            scores = q[:, head] @ k[:, kv].T / head_dim**0.5
            out[:, head] = torch.softmax(scores, -1) @ v[:, kv]
        h = h + out.reshape(size, -1) @ w[p + "self_attn.o_proj.weight"].T
        x = norm(h, w[p + "post_attention_layernorm.weight"])
        gate, up = x @ w[p + "mlp.gate_proj.weight"].T, x @ w[p + "mlp.up_proj.weight"].T
        h = h + (torch.nn.functional.silu(gate) * up) @ w[p + "mlp.down_proj.weight"].T
    return norm(h[1:], w["norm.weight"]) @ lm_head.T


# gpt-oss drafters project the 2880-wide hidden state to more query features than that, as their targets do
@pytest.mark.parametrize(("prefix", "sizes"), [("", {}), ("model.", {}), ("", {"head_dim": 24})],
                         ids=["plain", "prefixed", "queries-wider-than-hidden"])
def test_drafts_equal_the_formula_level_reference(prefix, sizes, tiny_gpt_oss, resident_target,
                                                  reference_hidden_states, tmp_path):
    hidden_states, embed, lm_head = reference_hidden_states
    folder = write_tiny_dflash(tmp_path / "drafter", target_config(tiny_gpt_oss), prefix=prefix, seed=3, **sizes)
    speculation = DFlashSpeculation(folder, None)
    speculation.load(resident_target)
    features = torch.cat([hidden_states[layer + 1] for layer in (0, 2)], dim=-1)  # the drafter's target layers
    block = [PROMPT[-1], *[300] * 5]  # the anchor, then the mask token
    expected = reference_draft_logits(folder, features, block, embed, lm_head)

    drafter = speculation.drafter
    with torch.inference_mode():
        context = drafter.new_context_cache(64)
        drafter.add_context(features[:12], context)  # committed in two pieces, as a generation does
        drafter.add_context(features[12:], context)
        logits = drafter.draft(torch.tensor(block), context)
        assert context.length == len(PROMPT)  # the block's rows are not kept
        proposer = DFlashProposer(drafter, drafter.new_context_cache(64))
        proposer.commit(PROMPT, features)
        proposal = proposer.propose(block[0], 5, Sampler(SamplingParams(), torch.device("cpu")))
    assert (logits - expected).abs().max() <= 1e-4
    assert expected.std() > 0.5
    assert proposal.tokens == expected.argmax(-1).tolist()
    assert proposal.probs is None  # greedy drafts are one-hot proposals


def break_hidden_size(folder, config):
    write_tiny_dflash(folder, {**config, "hidden_size": 32})


def break_vocabulary(folder, config):
    write_tiny_dflash(folder, config, vocab_size=1000)


def break_mask_id(folder, config):
    write_tiny_dflash(folder, config, mask_token_id=384)


def break_layer_ids(folder, config):
    write_tiny_dflash(folder, config, target_layer_ids=(1, 4))


def break_fc_width(folder, config):
    write_tiny_dflash(folder, config, fc_width=3 * 64)


def break_missing_dflash_config(folder, config):
    write_tiny_dflash(folder, config)
    drafter_config = json.loads((folder / "config.json").read_text())
    del drafter_config["dflash_config"]
    (folder / "config.json").write_text(json.dumps(drafter_config))


@pytest.mark.parametrize(("damage", "message"), [
    (break_hidden_size, "the drafter's hidden size 32 is not the target's 64"),
    (break_vocabulary, "the drafter's vocabulary (1000 tokens) is not the target's (384)"),
    (break_mask_id, "the drafter's mask token id 384 is outside the target's vocabulary (0 … 383)"),
    (break_layer_ids, "the drafter reads target layers [1, 4] but the target has layers 0 … 3"),
    (break_fc_width, "the drafter's fc.weight is [64, 192] but 2 target layers of hidden size 64 need [64, 128]"),
    (break_missing_dflash_config, "is not a DFlash drafter: its config.json (DFlashDraftModel) has no dflash_config"),
])
def test_a_drafter_that_does_not_fit_gives_one_clear_error(damage, message, tiny_gpt_oss, resident_target, tmp_path):
    damage(tmp_path / "drafter", target_config(tiny_gpt_oss))
    with pytest.raises(UserError) as error:
        DFlashSpeculation(tmp_path / "drafter", None).load(resident_target)
    assert message in str(error.value)
    assert "\n" not in str(error.value)


def test_a_forced_block_size_beyond_the_drafters_is_refused(tiny_dflash, tmp_path):
    shutil.copytree(tiny_dflash, tmp_path / "drafter")
    with pytest.raises(UserError, match="--block-size 7 is larger than the drafter's block size 6"):
        DFlashSpeculation(tmp_path / "drafter", 7)


def test_concurrent_generations_get_contexts_of_their_own_and_a_released_one_is_reused(tiny_gpt_oss, tiny_dflash):
    from app.engine.loader import load_model
    from app.engine.spec.dflash import DFlashSpeculation
    from app.model_folder import ModelFolder

    speculation = DFlashSpeculation(tiny_dflash, None)
    speculation.load(load_model(ModelFolder.open(tiny_gpt_oss), dtype="float32", context=64).model)
    first, second = speculation.new_drafter(64), speculation.new_drafter(64)
    assert first.context is not second.context
    speculation.release(first)
    assert speculation.new_drafter(64).context is first.context
    speculation.release(second)
    assert speculation.new_drafter(32).context not in (first.context, second.context)  # another capacity
