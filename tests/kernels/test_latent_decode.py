"""GLM-4.7-Flash's latent attention at one token on its Triton kernels (latent_cache, head_products, the decode
attention), in Triton's interpreter (see conftest.py): a tiny checkpoint's decode logits against the same model on
the kernels' torch references, attending through `attend`."""

import torch

from app.engine.loader import load_model
from app.kernels.head_products import head_products, head_products_torch
from app.kernels.latent_cache import latent_cache_write, latent_cache_write_torch
from app.model_folder import ModelFolder
from tests.fixtures.tiny_glm import write_tiny_glm

PROMPT = list(range(40, 52))


def test_latent_attention_kernels_give_the_logits_of_their_references(tmp_path):
    model = load_model(ModelFolder.open(write_tiny_glm(tmp_path / "flash", "glm4_moe_lite", mtp=False)),
                       device="cpu", dtype="float32", context=32).model
    attentions = [layer.attention for layer in model.layers]
    kernel = attentions[0].decode_attention
    # the interpreter runs the Triton kernels on the CPU
    assert kernel is not None and attentions[0].write_latent is latent_cache_write
    assert attentions[0].head_products is head_products

    def decode_logits(decode_attention, write_latent, products) -> torch.Tensor:
        for attention in attentions:
            attention.decode_attention, attention.write_latent = decode_attention, write_latent
            attention.head_products = products
        cache = model.new_kv_cache(32)
        model.forward(torch.tensor(PROMPT), cache)
        return torch.cat([model.forward(torch.tensor([token]), cache) for token in (7, 99, 3)])

    with torch.inference_mode():
        on_the_kernels = decode_logits(kernel, latent_cache_write, head_products)
        on_the_references = decode_logits(None, latent_cache_write_torch, head_products_torch)
    torch.testing.assert_close(on_the_kernels, on_the_references, rtol=1e-4, atol=1e-5)
