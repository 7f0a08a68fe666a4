"""The DFlash drafter's norms and residual adds on the add + RMSNorm kernel against its torch path: its context and
a draft block, tiny checkpoints, float32, in Triton's interpreter (see conftest.py), so the wiring runs in CI."""

import torch

from app.engine.loader import load_model
from app.engine.spec.dflash import DFlashSpeculation
from app.model_folder import ModelFolder


def draft_logits(target_folder, drafter_folder) -> torch.Tensor:
    """The drafter's logits [B - 1, V] for one block after a context of 9 positions, on a target loaded now (its
    norm op chosen as the environment says)."""
    target = load_model(ModelFolder.open(target_folder), device="cpu", dtype="float32", context=32).model
    speculation = DFlashSpeculation(drafter_folder, None)
    speculation.load(target)
    drafter = speculation.drafter
    width = len(drafter.config.target_layer_ids) * drafter.config.hidden_size
    features = torch.randn(9, width, generator=torch.Generator().manual_seed(5))
    with torch.inference_mode():
        context = drafter.new_context_cache(32)
        drafter.add_context(features, context)
        return drafter.draft(torch.tensor([17, 300, 300, 300, 300, 300]), context)


def test_drafts_on_the_norm_kernel_match_the_torch_path(tiny_gpt_oss, tiny_dflash, monkeypatch):
    fused = draft_logits(tiny_gpt_oss, tiny_dflash)
    monkeypatch.delenv("TRITON_INTERPRET")  # the ops pick their torch references now
    reference = draft_logits(tiny_gpt_oss, tiny_dflash)
    assert reference.std() > 0.5
    torch.testing.assert_close(fused, reference, rtol=1e-4, atol=1e-4)
