"""Prefill chunks on FP8 tensor cores (fp8_products_triton.py, fp8_linear_triton.py) in Triton's interpreter: x
quantized to e4m3 (a scale per token) against torch's own conversion, the dense products of both scale formats
against the float32 torch reference of that quantized x, at the default and at tiles that leave tails or split the
inputs, the epilogues, the tile rule, and which chunks take this path."""

import pytest
import torch

from app.kernels import fp8_bytes, fp8_linear_triton
from app.kernels.expert_tiles import Tiles
from app.kernels.fp8_linear import fp8_linear, fp8_linear_torch
from app.kernels.fp8_linear_triton import prefill_tiles, run_fp8_linear
from app.kernels.fp8_products_triton import quantize_activations, runs_fp8_products
from tests.kernels.poison import poisoned_allocations
from tests.kernels.test_fp8_linear import FORMATS, random_fp8_linear
from tests.kernels.test_gpt_oss_experts import relative_error

# float32 sums of the same e4m3 products in another order; rounded to bf16 (which the interpreter does by
# truncation) the output takes up to 2^-8
PRODUCT_ERROR = 1e-5
ROUNDED_ERROR = 4e-3
# e4m3's 4 significant bits: x quantized against x itself, and the products of each against float32 x
QUANTIZED_ERROR = 4e-2


def quantize_reference(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """torch's own float32 -> e4m3 conversion (round to nearest, ties to even) of x scaled per row, as
    quantize_activations' docstring says (the scale times 1 / 448 rounded to float32)."""
    x = x.float()
    scale = x.abs().amax(dim=1).clamp_min(1e-30) * (1 / 448)
    return (x / scale[:, None]).to(torch.float8_e4m3fn), scale


def dequantized_activations(x: torch.Tensor) -> torch.Tensor:
    """x [T, in] as the FP8 products see it, in float32."""
    q, scale = quantize_reference(x)
    return q.float() * scale[:, None]


def awkward_activations(dtype: torch.dtype) -> torch.Tensor:
    """Rows of very different sizes, a row of zeros, values at ties of e4m3's grid, and a long row's tail."""
    generator = torch.Generator().manual_seed(11)
    x = torch.randn(6, 1500, generator=generator) * torch.tensor([1.0, 1e-4, 300.0, 1.0, 1.0, 1.0])[:, None]
    x[1, :700] *= 1e-3  # subnormal e4m3 values beside normal ones
    x[3] = 0.0
    x[4, :8] = torch.tensor([448.0, 68.0, 127.1, -72.0, 50.0, 1e-5, -448.0, 3.0])  # 68, 50: ties between neighbours
    return x.to(dtype)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_quantized_activations_are_the_nearest_e4m3_values(dtype):
    x = awkward_activations(dtype)
    with poisoned_allocations():
        q, scale = quantize_activations(x)
    ref_q, ref_scale = quantize_reference(x)
    assert torch.equal(scale, ref_scale)
    assert torch.equal(q.float(), ref_q.float())  # -0 == 0
    assert relative_error(dequantized_activations(x), x.float()) < QUANTIZED_ERROR


# chunk tokens and tiles: a token tail (70 of 64), a row tail (136 of 128), inputs that end inside a step and a
# block column (200: block32, and the per-channel step of 128), block32's steps of 32, splits of the inputs (200 in
# steps of 64 asked for 3 splits: 128 and 72; 160 in steps of 32: 96 and 64; 384 in block128's steps: 3 of 128)
@pytest.mark.parametrize(("tokens", "out", "inputs", "fmt", "tiles"), [
    (70, 136, 200, "per-channel", None),
    (70, 136, 200, "block128", None),
    (40, 72, 224, "block32", None),
    (70, 136, 200, "per-channel", (32, Tiles(64, 64, warps=4, stages=2), 3)),
    (17, 96, 160, "block32", (32, Tiles(32, 32, warps=4, stages=2), 2)),
    (33, 64, 384, "block128", (64, Tiles(64, 128, warps=4, stages=2), 3)),
])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_fp8_products_match_float32_reference(tokens, out, inputs, fmt, tiles, dtype, monkeypatch):
    generator = torch.Generator().manual_seed(tokens + out + inputs)
    weight, scale = random_fp8_linear(out, inputs, fmt, generator)
    x = torch.randn(tokens, inputs, generator=generator).to(dtype)
    # float32 shares before the finishing launch's rounding, so that the products' own error shows
    monkeypatch.setattr(fp8_linear_triton, "finish_shares", lambda shares, dtype, glu, residual: shares.sum(dim=0))
    with poisoned_allocations():
        y = run_fp8_linear(x, weight, scale, FORMATS[fmt], tiles, residual=torch.zeros(tokens, out, dtype=dtype),
                           fp8_products=True)
    assert y.dtype == torch.float32
    seen = dequantized_activations(x)
    assert relative_error(y, fp8_linear_torch(seen, weight, scale, FORMATS[fmt])) < PRODUCT_ERROR
    assert relative_error(y, fp8_linear_torch(x.float(), weight, scale, FORMATS[fmt])) < QUANTIZED_ERROR


def test_prefill_tiles_split_where_wide_ones_leave_sms_idle():
    tiles = Tiles(128, 128, warps=8, stages=4)
    # GLM-4.5-Air-FP8 on 132 SMs: q_proj's 96 row tiles and the dense MLP's 86 keep one split at 128 tokens
    assert prefill_tiles(128, 12288, 132) == prefill_tiles(128, 10944, 132) == (128, tiles, 1)
    # o_proj's 32 row tiles: 32 programs at 128 tokens (64 even split in two: 64 tokens a tile), 64 at 256
    assert prefill_tiles(128, 4096, 132) == (64, tiles, 2)
    assert prefill_tiles(256, 4096, 132) == (128, tiles, 2)
    assert prefill_tiles(512, 4096, 132) == (128, tiles, 1)


@pytest.mark.parametrize(("glu", "with_residual"), [(True, False), (False, True), (True, True)])
def test_epilogues_after_fp8_products_match_reference(glu, with_residual):
    generator = torch.Generator().manual_seed(5 + glu)
    weight, scale = random_fp8_linear(144, 256, "block128", generator)
    x = torch.randn(33, 256, generator=generator).bfloat16()
    residual = torch.randn(33, 72 if glu else 144, generator=generator).bfloat16() if with_residual else None
    with poisoned_allocations():
        y = fp8_linear(x, weight, scale, FORMATS["block128"], glu=glu, residual=residual)
    ref = fp8_linear_torch(dequantized_activations(x), weight, scale, FORMATS["block128"], glu=glu,
                           residual=None if residual is None else residual.float())
    assert y.dtype == torch.bfloat16 and y.shape == ref.shape
    assert relative_error(y, ref) < ROUNDED_ERROR


def test_prefill_chunk_without_epilogues_comes_in_x_dtype():
    generator = torch.Generator().manual_seed(6)
    weight, scale = random_fp8_linear(40, 128, "per-channel", generator)
    x = torch.randn(20, 128, generator=generator).half()
    with poisoned_allocations():
        y = fp8_linear(x, weight, scale)
    assert y.dtype == torch.float16 and y.shape == (20, 40)
    assert relative_error(y, fp8_linear_torch(dequantized_activations(x), weight, scale)) < ROUNDED_ERROR


def test_only_16_bit_prefill_chunks_of_fp8_weights_on_fp8_tensor_cores_take_the_products(monkeypatch):
    generator = torch.Generator().manual_seed(2)
    weight, _ = random_fp8_linear(64, 128, "per-channel", generator)
    chunk = torch.randn(17, 128, generator=generator)
    assert runs_fp8_products(chunk.bfloat16(), weight) and runs_fp8_products(chunk.half(), weight)
    assert not runs_fp8_products(chunk, weight)  # float32 x keeps float32 products
    assert not runs_fp8_products(chunk[:16].bfloat16(), weight)  # a verify block
    assert not runs_fp8_products(chunk.bfloat16(), weight.bfloat16())
    monkeypatch.setenv(fp8_bytes.FORCE, "1")  # as before sm_89: no FP8 tensor cores
    assert not runs_fp8_products(chunk.bfloat16(), weight)
