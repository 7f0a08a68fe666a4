"""The decode step on the fused kernels (add + norm, rotary + KV write, routers, decode attention, resident
slots, experts) against the same model on its torch path: tiny checkpoints, float32, in Triton's interpreter (see
conftest.py), so the wiring of the kernels into the models runs in CI. GPT-OSS, and GLM's grouped-query models:
GLM-4.5-Air's layout (q/k/v biases, partial rotary; grouped routing here) and GLM-4.5-FP8's (q/k norms)."""

import pytest
import torch

from app.engine.experts.cache import ExpertCache
from app.engine.loader import load_model
from app.engine.models import gpt_oss
from app.kernels.norms import add_rms_norm_half_pairs
from app.kernels.pick_rows import PickRows
from app.model_folder import ModelFolder
from tests.fixtures.tiny_glm import write_tiny_glm

PROMPT = list(range(40, 46))


def greedy_logits(folder, steps: int, dtype: str = "float32") -> tuple[list[int], torch.Tensor]:
    """Greedy tokens and their logits [steps, V] of eager passes: the prompt, then one token at a time."""
    model = load_model(ModelFolder.open(folder), device="cpu", dtype=dtype, context=32).model
    cache = model.new_kv_cache(32)
    with torch.inference_mode():
        logits = [model.forward(torch.tensor(PROMPT), cache, last_only=True)[-1]]
        tokens = [int(logits[-1].argmax())]
        for _ in range(steps - 1):
            logits.append(model.forward(torch.tensor(tokens[-1:]), cache)[-1])
            tokens.append(int(logits[-1].argmax()))
    return tokens, torch.stack(logits)


@pytest.fixture(scope="module", params=["gpt_oss", "glm4_moe", "glm4_moe_fp8"])
def checkpoint(request, tiny_gpt_oss, tmp_path_factory):
    if request.param == "gpt_oss":
        return tiny_gpt_oss
    return write_tiny_glm(tmp_path_factory.mktemp(request.param), request.param, mtp=False)


def test_fused_decode_steps_match_the_torch_path(checkpoint, monkeypatch):
    fused_tokens, fused = greedy_logits(checkpoint, 3)
    monkeypatch.delenv("TRITON_INTERPRET")  # the ops pick their torch references now
    torch_tokens, reference = greedy_logits(checkpoint, 3)
    assert fused_tokens == torch_tokens
    torch.testing.assert_close(fused, reference, rtol=1e-4, atol=1e-4)


def test_gpt_oss_few_token_experts_take_their_inputs_from_the_norm(tiny_gpt_oss, monkeypatch):
    """bf16: the post-attention norm of each pass of up to 16 tokens also gives the MXFP4 experts their float16
    pairs, and the logits are those of the experts converting the norm themselves."""
    norms = []
    monkeypatch.setattr(gpt_oss, "add_rms_norm_half_pairs",
                        lambda *args: norms.append(1) or add_rms_norm_half_pairs(*args))
    tokens, logits = greedy_logits(tiny_gpt_oss, 3, "bfloat16")
    assert len(norms) == 3 * 4  # the 4 layers of the prompt's pass (6 tokens) and of the two one-token steps
    monkeypatch.setattr(ExpertCache, "takes_hidden_pairs", lambda *args: False)
    converting_tokens, converting = greedy_logits(tiny_gpt_oss, 3, "bfloat16")
    assert tokens == converting_tokens and torch.equal(logits, converting)


def test_gpt_oss_captured_features_are_the_layer_outputs(tiny_gpt_oss):
    """bf16 on the fused kernels, where a layer's experts leave their picks' rows for the next norm to sum: the
    features a pass captures for a drafter (taken from the next layer's norm) are each layer's output, its picks
    summed as `sum_picks` sums them, within the last add's rounding (Triton's interpreter truncates to bf16)."""
    model = load_model(ModelFolder.open(tiny_gpt_oss), device="cpu", dtype="bfloat16", context=32).model
    ids, layers = torch.tensor(PROMPT), tuple(range(len(model.layers) - 1))
    with torch.inference_mode():
        _, features = model.forward(ids, model.new_kv_cache(32), capture=layers)
        cache = model.new_kv_cache(32)
        context = model.attention_context(len(ids), cache)
        x, picks, outputs = model.embed[ids], None, []
        for index in range(len(model.layers)):
            x, routing = model.until_experts(index, x, context, cache, picks)
            picks = model.routed_experts(index, routing)
            assert isinstance(picks, PickRows)
            outputs.append(x + picks.total(x.dtype))
    torch.testing.assert_close(features, torch.cat(outputs[:-1], dim=-1), rtol=2**-7, atol=0)
