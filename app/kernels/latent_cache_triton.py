"""latent_cache.py's pass in one Triton kernel: two programs a token, one normalising the query latent, one
normalising the KV latent and writing it, with the rotated rope key after it, into the cache row of the token's
position. A program holds its whole vector (up to a few thousand floats), so each RMSNorm is one sum."""

import torch
import triton
import triton.language as tl

from app.kernels.dependent_launch import after_earlier_kernels, dependent_launch
from app.kernels.rotation_triton import rotated


def run_latent_cache_write(
    latent_inputs: torch.Tensor, query_norm: torch.Tensor, latent_norm: torch.Tensor, eps: float,
    cos: torch.Tensor, sin: torch.Tensor, positions: torch.Tensor, latents: torch.Tensor, interleaved: bool,
) -> torch.Tensor:
    """latent_inputs [T, Q + L + R], query_norm [Q], latent_norm [L], cos/sin [T, R / 2], positions [T],
    latents [C, L + R] -> the normalised query latent [T, Q]."""
    tokens, width = latent_inputs.shape
    queries, latent = query_norm.shape[0], latent_norm.shape[0]
    rope = latents.shape[1] - latent
    assert width == queries + latent + rope and cos.shape == sin.shape == (tokens, rope // 2)
    assert latent_inputs.stride(1) == 1 and latents.stride(1) == 1 and latents.dtype == latent_inputs.dtype
    query_latent = torch.empty((tokens, queries), dtype=latent_inputs.dtype, device=latent_inputs.device)
    _latent_cache_kernel[(tokens, 2)](
        latent_inputs, query_norm.contiguous(), latent_norm.contiguous(), cos.contiguous(), sin.contiguous(),
        positions, latents, query_latent, latent_inputs.stride(0), latents.stride(0), eps,
        QUERIES=queries, LATENT=latent, ROPE=rope, QUERY_BLOCK=triton.next_power_of_2(queries),
        LATENT_BLOCK=triton.next_power_of_2(latent), ROPE_BLOCK=triton.next_power_of_2(rope),
        INTERLEAVED=interleaved, num_warps=4, **dependent_launch(latent_inputs.device),
    )
    return query_latent


@triton.jit
def _rms_normed(row_ptr, weight_ptr, eps, SIZE: tl.constexpr, BLOCK: tl.constexpr):
    """-> (rms_norm(row) * weight [BLOCK] in float32, its mask), as app/kernels/norms.rms_norm computes it."""
    dim = tl.arange(0, BLOCK)
    inside = dim < SIZE
    x = tl.load(row_ptr + dim, mask=inside, other=0.0).to(tl.float32)
    inverse = 1.0 / tl.sqrt(tl.sum(x * x, axis=0) / SIZE + eps)
    return x * inverse * tl.load(weight_ptr + dim, mask=inside, other=0.0).to(tl.float32), inside


@triton.jit
def _write_query(row_ptr, norm_ptr, eps, query_ptr, SIZE: tl.constexpr, BLOCK: tl.constexpr):
    normed, inside = _rms_normed(row_ptr, norm_ptr, eps, SIZE, BLOCK)
    tl.store(query_ptr + tl.arange(0, BLOCK), normed.to(query_ptr.dtype.element_ty), mask=inside)


@triton.jit
def _write_latent(row_ptr, norm_ptr, eps, cos_ptr, sin_ptr, token, target_ptr, LATENT: tl.constexpr,
                  ROPE: tl.constexpr, LATENT_BLOCK: tl.constexpr, ROPE_BLOCK: tl.constexpr, INTERLEAVED: tl.constexpr):
    normed, inside = _rms_normed(row_ptr, norm_ptr, eps, LATENT, LATENT_BLOCK)
    tl.store(target_ptr + tl.arange(0, LATENT_BLOCK), normed.to(target_ptr.dtype.element_ty), mask=inside)
    key, rotary = rotated(row_ptr + LATENT, cos_ptr, sin_ptr, token, ROPE, ROPE_BLOCK, INTERLEAVED)
    tl.store(target_ptr + LATENT + tl.arange(0, ROPE_BLOCK), key.to(target_ptr.dtype.element_ty), mask=rotary)


@triton.jit
def _latent_cache_kernel(inputs_ptr, query_norm_ptr, latent_norm_ptr, cos_ptr, sin_ptr, positions_ptr, latents_ptr,
                         query_ptr, input_stride, latent_stride, eps,
                         QUERIES: tl.constexpr, LATENT: tl.constexpr, ROPE: tl.constexpr, QUERY_BLOCK: tl.constexpr,
                         LATENT_BLOCK: tl.constexpr, ROPE_BLOCK: tl.constexpr, INTERLEAVED: tl.constexpr,
                         PDL: tl.constexpr):
    after_earlier_kernels(PDL)
    token = tl.program_id(0).to(tl.int64)
    row = inputs_ptr + token * input_stride
    if tl.program_id(1) == 0:
        _write_query(row, query_norm_ptr, eps, query_ptr + token * QUERIES, QUERIES, QUERY_BLOCK)
    else:
        target = latents_ptr + tl.load(positions_ptr + token).to(tl.int64) * latent_stride
        _write_latent(row + QUERIES, latent_norm_ptr, eps, cos_ptr, sin_ptr, token, target, LATENT, ROPE,
                      LATENT_BLOCK, ROPE_BLOCK, INTERLEAVED)
