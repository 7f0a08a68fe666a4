"""The SiLU-gated expert op and FP8 dequantization against their direct definitions."""

import pytest
import torch

from app.kernels.formats.fp8 import dequantize_blocks, dequantize_per_channel
from app.kernels.glu_experts import glu_experts_torch
from tests.fixtures.tiny_glm import dequantize_reference, quantize_fp8

HIDDEN, WIDTH = 200, 136  # not multiples of 128: the last block row and column are partial
SLOTS = 5


@pytest.mark.parametrize(("shape", "block"), [
    ((128, 128), (128, 128)),
    ((300, 200), (128, 128)),
    ((576, 1000), (128, 128)),  # GLM-5's kv_a_proj_with_mqa has 576 rows: 4.5 blocks
    ((1, 130), (128, 128)),
    ((48, 70), (32, 32)),
])
def test_block_dequantization_equals_the_direct_definition(shape, block):
    generator = torch.Generator().manual_seed(shape[0])
    weight, scale = quantize_fp8(torch.randn(shape, generator=generator), list(block))
    assert scale.shape == (-(-shape[0] // block[0]), -(-shape[1] // block[1]))
    expected = dequantize_reference(weight, scale, list(block))
    assert torch.equal(dequantize_blocks(weight, scale, block, torch.float32), expected)
    assert torch.equal(dequantize_blocks(weight[None], scale[None], block, torch.float32)[0], expected)


def test_per_channel_dequantization_equals_the_direct_definition():
    weight, scale = quantize_fp8(torch.randn(300, 200, generator=torch.Generator().manual_seed(1)), None)
    assert scale.shape == (300, 1)
    assert torch.equal(dequantize_per_channel(weight, scale, torch.float32), dequantize_reference(weight, scale, None))


def random_arenas(fp8: str | None, generator: torch.Generator) -> tuple[dict, dict]:
    """(arenas as the cache holds them, the same weights dequantized: name -> [S, out, in] float32)."""
    shapes = {"gate_proj": (WIDTH, HIDDEN), "up_proj": (WIDTH, HIDDEN), "down_proj": (HIDDEN, WIDTH)}
    block = [128, 128] if fp8 == "fp8" else None
    arenas, dense = {}, {}
    for name, (out, inputs) in shapes.items():
        masters = [torch.randn(out, inputs, generator=generator) / inputs**0.5 for _ in range(SLOTS)]
        if fp8 is None:
            arenas[f"{name}.weight"] = torch.stack(masters).to(torch.bfloat16)
            dense[name] = arenas[f"{name}.weight"].float()
            continue
        stored = [quantize_fp8(master, block) for master in masters]
        arenas[f"{name}.weight"] = torch.stack([weight for weight, _ in stored])
        arenas[f"{name}.weight_scale_inv" if block else f"{name}.weight_scale"] = torch.stack([s for _, s in stored])
        dense[name] = torch.stack([dequantize_reference(weight, scale, block) for weight, scale in stored])
    return arenas, dense


@pytest.mark.parametrize("fp8", [None, "compressed-tensors", "fp8"])
def test_glu_experts_equal_the_weighted_sum_of_silu_gated_experts(fp8):
    generator = torch.Generator().manual_seed(3)
    arenas, dense = random_arenas(fp8, generator)
    hidden = torch.randn(7, HIDDEN, generator=generator)
    slots = torch.randint(0, SLOTS, (7, 3), generator=generator)
    slots[0, 1] = slots[4, 0] = -1  # experts of another group: skipped
    weights = torch.rand(7, 3, generator=generator)
    expected = torch.zeros_like(hidden)
    for token in range(7):
        for pick in range(3):
            slot = int(slots[token, pick])
            if slot < 0:
                continue
            x = hidden[token]
            gate, up = dense["gate_proj"][slot] @ x, dense["up_proj"][slot] @ x
            activation = gate / (1 + torch.exp(-gate)) * up
            expected[token] += weights[token, pick] * (dense["down_proj"][slot] @ activation)
    ours = glu_experts_torch(hidden, arenas, slots, weights, fp8_block=(128, 128) if fp8 == "fp8" else None)
    assert torch.allclose(ours, expected, atol=1e-5, rtol=1e-5)
    assert expected.abs().max() > 0.1
