"""The GPT-OSS decode step on the fused kernels (add + norm, rotary + KV write, router, decode attention,
resident slots, experts) against the same model on its torch path: tiny checkpoint, float32, in Triton's
interpreter (see conftest.py), so the wiring of the kernels into the model runs in CI."""

import torch

from app.engine.loader import load_model
from app.model_folder import ModelFolder

PROMPT = list(range(40, 46))


def greedy_logits(folder, steps: int) -> tuple[list[int], torch.Tensor]:
    """Greedy tokens and their logits [steps, V] of eager passes: the prompt, then one token at a time."""
    model = load_model(ModelFolder.open(folder), device="cpu", dtype="float32", context=32).model
    cache = model.new_kv_cache(32)
    with torch.inference_mode():
        logits = [model.forward(torch.tensor(PROMPT), cache, last_only=True)[-1]]
        tokens = [int(logits[-1].argmax())]
        for _ in range(steps - 1):
            logits.append(model.forward(torch.tensor(tokens[-1:]), cache)[-1])
            tokens.append(int(logits[-1].argmax()))
    return tokens, torch.stack(logits)


def test_fused_decode_steps_match_the_torch_path(tiny_gpt_oss, monkeypatch):
    fused_tokens, fused = greedy_logits(tiny_gpt_oss, 3)
    monkeypatch.delenv("TRITON_INTERPRET")  # the ops pick their torch references now
    torch_tokens, reference = greedy_logits(tiny_gpt_oss, 3)
    assert fused_tokens == torch_tokens
    torch.testing.assert_close(fused, reference, rtol=1e-4, atol=1e-4)

