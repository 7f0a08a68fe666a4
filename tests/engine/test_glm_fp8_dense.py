"""Dense FP8 weights kept FP8 (what the engine does on a GPU), forced here on the CPU where the FP8 linear op is
its torch reference: every dense FP8 linear of the checkpoint stays an Fp8Weight, the planner counts exactly
those bytes as stored, and logits and MTP drafts equal the dequantized model's (the CPU default)."""

import pytest
import torch

from app.engine import loader
from app.engine.layers import linear
from app.engine.layers.linear import Fp8Weight
from app.engine.loader import load_model
from app.engine.models.glm import GlmModel
from app.model_folder import ModelFolder
from app.plan import DEQUANTIZED_FP8, FP8_DTYPE

LENGTH = 12


def load_recording_weights(folder, monkeypatch, fp8_kept: bool):
    """The model in float32 and {module: what GlmModel.weight returned for it}."""
    monkeypatch.setattr(linear, "keeps_fp8", lambda device: fp8_kept)
    monkeypatch.setattr(loader, "keeps_fp8", lambda device: fp8_kept)
    returned = {}
    weight = GlmModel.weight

    def recording(self, module, *args, **kwargs):
        returned[module] = weight(self, module, *args, **kwargs)
        return returned[module]

    monkeypatch.setattr(GlmModel, "weight", recording)
    loaded = load_model(ModelFolder.open(folder), dtype="float32", context=2 * LENGTH, gpu_budget=None)
    return loaded, returned


def logits_and_drafts(model):
    ids = torch.randint(0, model.config.vocab_size, (LENGTH,), generator=torch.Generator().manual_seed(0))
    last_layer = model.config.num_hidden_layers - 1
    with torch.no_grad():
        logits, hidden = model.forward(ids, model.new_kv_cache(2 * LENGTH), capture=(last_layer,))
        drafter = model.load_mtp()
        drafts, _ = drafter.draft(hidden[:-1], ids[1:], drafter.new_kv_cache(2 * LENGTH))
    return logits, drafts


@pytest.mark.parametrize("variant", ["glm4_moe_fp8", "glm_moe_dsa_fp8"])  # per-channel GQA; block-scaled MLA + DSA
def test_kept_fp8_weights_give_the_dequantized_models_logits(variant, tiny_glm, monkeypatch):
    folder = tiny_glm(variant)
    kept, returned = load_recording_weights(folder, monkeypatch, fp8_kept=True)
    fp8_logits, fp8_drafts = logits_and_drafts(kept.model)  # loads the MTP layer too
    stored_fp8 = {name.removesuffix(".weight") for name, info in kept.folder.tensors.items()
                  if info.dtype == FP8_DTYPE and ".mlp.experts." not in name}
    kept_fp8 = {module for module, weight in returned.items() if isinstance(weight, Fp8Weight)}
    assert kept_fp8 == {module for module in stored_fp8 if DEQUANTIZED_FP8 not in module + "."}
    assert kept_fp8 and all(isinstance(w, torch.Tensor) for m, w in returned.items() if m not in kept_fp8)

    target = {m for m in kept_fp8 if not m.startswith(f"model.layers.{kept.model.config.num_hidden_layers}.")}
    kept_bytes = sum(returned[m].weight.nbytes + returned[m].scale.nbytes for m in target)
    assert kept.facts.resident_fp8_bytes == kept_bytes
    dequantized_elements = kept.facts.resident_weights - sum(returned[m].weight.numel() for m in target)
    assert kept.placement.resident_bytes == dequantized_elements * 4 + kept_bytes

    monkeypatch.undo()
    plain, _ = load_recording_weights(folder, monkeypatch, fp8_kept=False)
    plain_logits, plain_drafts = logits_and_drafts(plain.model)
    assert plain.placement.resident_bytes == plain.facts.resident_weights * 4 > kept.placement.resident_bytes
    torch.testing.assert_close(fp8_logits, plain_logits, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(fp8_drafts, plain_drafts, rtol=1e-5, atol=1e-5)
