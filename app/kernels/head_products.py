"""Per-head products of the latent attention (MLA) at a few tokens: each head's inputs times that head's own
weight rows, as MLA moves its queries into latent space (kv_b's key half, absorbed) and its attention output back
out of it (the value half); beside the queries' product, the same launch rotates their rope dims.

`head_products` runs the Triton kernel of head_products_triton.py for up to `FEW_TOKENS` tokens (a program reads
its weight rows once a token, from L2 after the first) and the batched product of `head_products_torch`, which
reads them once, for longer passes; `head_products_op` picks one for a device.
"""

from collections.abc import Callable

import torch

from app.kernels.choice import kernel_or_reference
from app.kernels.rotary_cache import rotate

FEW_TOKENS = 16  # a decode step, or a speculative verification's block


def head_products_torch(
    x: torch.Tensor, weight: torch.Tensor, cos: torch.Tensor | None = None, sin: torch.Tensor | None = None,
    interleaved: bool = True,
) -> torch.Tensor:
    """x [T, heads, K + R], weight [heads, N, K] -> [T, heads, N + R] in x's dtype: each head's first K inputs
    times its N weight rows, then its last R inputs rotated by cos/sin [T, R / 2] (interleaved pairs or halves;
    R = 0 without them)."""
    inputs = weight.shape[2]
    products = torch.einsum("thk,hnk->thn", x[..., :inputs], weight)
    if cos is None:
        return products
    return torch.cat((products, rotate(x[..., inputs:], cos, sin, interleaved)), dim=-1)


def head_products(
    x: torch.Tensor, weight: torch.Tensor, cos: torch.Tensor | None = None, sin: torch.Tensor | None = None,
    interleaved: bool = True,
) -> torch.Tensor:
    """`head_products_torch` in one Triton launch for up to FEW_TOKENS tokens."""
    if x.shape[0] > FEW_TOKENS:
        return head_products_torch(x, weight, cos, sin, interleaved)
    from app.kernels.head_products_triton import run_head_products  # Triton exists on Linux only

    return run_head_products(x, weight, cos, sin, interleaved)


def head_products_op(device: torch.device) -> Callable[..., torch.Tensor]:
    return kernel_or_reference(device, head_products, head_products_torch)
