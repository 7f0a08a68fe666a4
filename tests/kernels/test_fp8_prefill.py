"""Prefill chunks of per-channel FP8 weights with activations quantized per token (fp8_prefill.py): torch's FP8
GEMM (on the CPU here, cuBLAS's on a GPU: test_fp8_linear_cuda.py) against the float32 product of the same
quantized operands, and the quantization's own error against 16-bit activations."""

import pytest
import torch

from app.kernels.fp8_linear import fp8_linear_torch
from app.kernels.fp8_prefill import E4M3_LARGEST, quantize_per_token, w8a8_fits, w8a8_linear, w8a8_linear_torch
from tests.kernels.test_fp8_linear import random_fp8_linear
from tests.kernels.test_gpt_oss_experts import relative_error


@pytest.mark.parametrize("glu", [False, True], ids=["plain", "glu"])
@pytest.mark.parametrize("with_residual", [False, True], ids=["", "residual"])
def test_gemm_matches_the_product_of_the_quantized_operands(glu, with_residual):
    generator = torch.Generator().manual_seed(3)
    weight, scale = random_fp8_linear(96, 256, "per-channel", generator)
    x = torch.randn(40, 256, generator=generator).bfloat16()
    residual = torch.randn(40, 48 if glu else 96, generator=generator).bfloat16() if with_residual else None
    y = w8a8_linear(x, weight, scale, glu, residual)
    assert y.dtype == torch.bfloat16 and y.shape == (40, 48 if glu else 96)
    assert relative_error(y, w8a8_linear_torch(x, weight, scale, glu, residual)) < 1e-2
    # the activations' e4m3 rounding: a few percent of the product, as the checkpoint's own scheme has it
    assert relative_error(y, fp8_linear_torch(x.float(), weight, scale, None, glu, residual)) < 6e-2


def test_each_token_gets_its_own_scale_and_zeros_stay_zero():
    x = torch.tensor([[0.5, -2.0, 1.0, 0.0], [0.0, 0.0, 0.0, 0.0], [1e-3, 3e-3, -4e-3, 0.0]], dtype=torch.bfloat16)
    quantized, scale = quantize_per_token(x)
    assert quantized.dtype == torch.float8_e4m3fn and scale.shape == (3, 1)
    assert quantized.float().abs().amax(-1).tolist() == [E4M3_LARGEST, 0.0, E4M3_LARGEST]
    assert scale.isfinite().all() and (quantized.float() * scale)[1].eq(0).all()
    assert relative_error(quantized.float() * scale, x.float()) < 0.07


def test_only_bf16_activations_of_per_channel_weights_on_a_gpu_take_it():
    weight, _ = random_fp8_linear(96, 256, "per-channel", torch.Generator().manual_seed(1))
    x = torch.randn(40, 256).bfloat16()
    assert not w8a8_fits(x, weight, None)  # the CPU: the tiled kernel in the interpreter, or the reference
    if torch.cuda.is_available():
        assert w8a8_fits(x.cuda(), weight.cuda(), None)
        assert not w8a8_fits(x.cuda(), weight.cuda(), (128, 128))
        assert not w8a8_fits(x.float().cuda(), weight.cuda(), None)
        assert not w8a8_fits(x.half().cuda(), weight.cuda(), None)
