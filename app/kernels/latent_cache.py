"""The latent attention's (MLA's) work between its first product and its query heads: one pass that normalises the
query latent, normalises the KV latent, rotates the shared rope key and writes both into the latent cache.

The first product is q_a and kv_a stacked ([T, Q + L + R]: query latent, KV latent, rope key), so one launch of
`latent_cache_write` (latent_cache_triton.py) follows one product; `latent_cache_write_torch` is the reference with
the same signature; `latent_cache_write_op` picks one for a device.
"""

from collections.abc import Callable

import torch

from app.kernels.choice import kernel_or_reference
from app.kernels.norms import rms_norm
from app.kernels.rotary_cache import rotate


def latent_cache_write_torch(
    latent_inputs: torch.Tensor, query_norm: torch.Tensor, latent_norm: torch.Tensor, eps: float,
    cos: torch.Tensor, sin: torch.Tensor, positions: torch.Tensor, latents: torch.Tensor, interleaved: bool,
) -> torch.Tensor:
    """latent_inputs [T, Q + L + R], query_norm [Q] and latent_norm [L] float32, cos/sin [T, R / 2], positions [T],
    latents [C, L + R] -> the normalised query latent [T, Q]; rows `positions` of `latents` get the normalised KV
    latent and the rotated rope key (interleaved pairs or halves)."""
    queries, latent = query_norm.shape[0], latent_norm.shape[0]
    query_latent, kv_latent, key_rope = latent_inputs.split((queries, latent, latents.shape[1] - latent), dim=-1)
    row = torch.cat((rms_norm(kv_latent, latent_norm, eps), rotate(key_rope[:, None], cos, sin, interleaved)[:, 0]),
                    dim=-1)
    latents.index_copy_(0, positions, row)
    return rms_norm(query_latent, query_norm, eps)


def latent_cache_write(
    latent_inputs: torch.Tensor, query_norm: torch.Tensor, latent_norm: torch.Tensor, eps: float,
    cos: torch.Tensor, sin: torch.Tensor, positions: torch.Tensor, latents: torch.Tensor, interleaved: bool,
) -> torch.Tensor:
    """`latent_cache_write_torch` in one Triton launch."""
    from app.kernels.latent_cache_triton import run_latent_cache_write  # Triton exists on Linux only

    return run_latent_cache_write(latent_inputs, query_norm, latent_norm, eps, cos, sin, positions, latents,
                                  interleaved)


def latent_cache_write_op(device: torch.device) -> Callable[..., torch.Tensor]:
    return kernel_or_reference(device, latent_cache_write, latent_cache_write_torch)
