"""GLM-4.7-Flash's latent attention at one token on the decode attention kernel, in Triton's interpreter (see
conftest.py): a tiny checkpoint's decode logits against the same model attending through `attend`."""

import torch

from app.engine.loader import load_model
from app.model_folder import ModelFolder
from tests.fixtures.tiny_glm import write_tiny_glm

PROMPT = list(range(40, 52))


def test_latent_decode_attention_gives_the_logits_of_attend(tmp_path):
    model = load_model(ModelFolder.open(write_tiny_glm(tmp_path / "flash", "glm4_moe_lite", mtp=False)),
                       device="cpu", dtype="float32", context=32).model
    attentions = [layer.attention for layer in model.layers]
    kernel = attentions[0].decode_attention
    assert kernel is not None  # the interpreter runs the Triton kernels on the CPU

    def decode_logits(decode_attention) -> torch.Tensor:
        for attention in attentions:
            attention.decode_attention = decode_attention
        cache = model.new_kv_cache(32)
        model.forward(torch.tensor(PROMPT), cache)
        return torch.cat([model.forward(torch.tensor([token]), cache) for token in (7, 99, 3)])

    with torch.inference_mode():
        on_the_kernel, through_attend = decode_logits(kernel), decode_logits(None)
    torch.testing.assert_close(on_the_kernel, through_attend, rtol=1e-4, atol=1e-5)
