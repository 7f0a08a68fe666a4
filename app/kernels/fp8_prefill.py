"""Prefill chunks of an FP8 weight with one scale per output channel, as its checkpoint was quantized to run:
compressed-tensors' FP8 scheme of GLM-4.5(-Air)-FP8 quantizes the activations too, dynamically, one scale per
token ("input_activations": {"dynamic": true, "strategy": "token"}). x is quantized to e4m3 with its token's
scale, and cuBLAS's FP8 GEMM (torch._scaled_mm) multiplies both in float32 and applies both scales in its
epilogue: a chunk of 256 tokens through q_proj took 106 µs in the tiled kernel (FP8 weights converted to
float16 in registers) against 42 for bf16 cuBLAS on twice the bytes (bench/NOTES.md).

Decode steps and verify blocks (fp8_linear_triton.DECODE_TOKENS tokens at most) keep 16-bit activations: there the
weight's bytes decide the time, and a verify block computes what decode steps would. `w8a8_linear_torch` is the
reference: both operands dequantized in float32.
"""

import torch

from app.kernels.fp8_linear import epilogue_torch

E4M3_LARGEST = 448.0
SMALLEST_SCALE = 1e-12  # a token of zeros keeps a finite scale


def w8a8_fits(x: torch.Tensor, weight: torch.Tensor, block: tuple[int, int] | None) -> bool:
    """bf16 activations on a GPU (its row-scaled FP8 GEMM writes bf16), a per-channel weight, shapes it takes."""
    return (x.is_cuda and x.dtype == torch.bfloat16 and block is None and x.shape[1] % 16 == 0
            and weight.shape[0] % 16 == 0)


def quantize_per_token(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """x [T, K] -> (e4m3 [T, K], float32 [T, 1]) whose product is x rounded to e4m3 after its token's scale."""
    scale = x.abs().amax(-1, keepdim=True).float().clamp(min=SMALLEST_SCALE) / E4M3_LARGEST
    return (x.float() / scale).to(torch.float8_e4m3fn), scale


def w8a8_linear(x: torch.Tensor, weight: torch.Tensor, scale: torch.Tensor, glu: bool = False,
                residual: torch.Tensor | None = None) -> torch.Tensor:
    """x [T, in] @ (weight [out, in] e4m3 × scale [out, 1]).T with x quantized per token -> [T, out] in x's dtype,
    then fp8_linear's epilogues."""
    quantized, x_scale = quantize_per_token(x)
    y = torch._scaled_mm(quantized, weight.t(), scale_a=x_scale, scale_b=scale.view(1, -1).float(),
                         out_dtype=x.dtype)
    return epilogue_torch(y, glu, residual)


def w8a8_linear_torch(x: torch.Tensor, weight: torch.Tensor, scale: torch.Tensor, glu: bool = False,
                      residual: torch.Tensor | None = None) -> torch.Tensor:
    quantized, x_scale = quantize_per_token(x)
    y = (quantized.float() * x_scale) @ (weight.float() * scale.float()).T
    return epilogue_torch(y, glu, None if residual is None else residual.float()).to(x.dtype)
