"""A dense linear layer with an FP8 weight kept as stored: y = x @ dequant(W).T.

weight [out, in] float8_e4m3fn with its scale, [out, 1] (one per output channel, compressed-tensors;
`block` None) or [ceil(out/b0), ceil(in/b1)] (one per b0 × b1 block, `block` = (b0, b1)); x [T, in] in
bf16 / fp16 / float32 -> [T, out] in x's dtype. Two epilogues save a layer's launches: `glu` (the weight's
rows are gate rows then up rows: -> SiLU(gate) * up [T, out / 2], a SiLU-gated MLP's first product in one) and
`residual` [T, out] (added to the product: a residual stream's add). `fp8_linear_torch` is the reference,
`fp8_linear` the Triton kernel, `fp8_linear_op` picks one for a device.

One token is a matrix-vector product on CUDA cores (rows_times_vector_triton.py). A prefill chunk with 16-bit x on
FP8 tensor cores runs FP8 x FP8 products (fp8_products_triton.py). Other tokens run the expert kernels' matmul
(glu_experts_triton.py) for one weight: weights are the M side of each product
(out^T = W @ x^T), so the token side of a tile is 16 for a verify block; FP8 weights are converted in
registers (to float16 with 16-bit activations, one instruction per two weights; float32 in the interpreter,
whose bf16 tl.dot is wrong); a per-channel scale multiplies the float32 sums once, a block scale once per
step (a step never straddles a block column); the sums stay float32 until the store.

`one_token_linear` runs the one-token kernel on an unscaled weight (bf16, fp16, float32), for the epilogues'
launches it saves.

The kernel picks its tiles by token count (fp8_linear_triton.py says why). Every launch has shapes fixed by
(T, out, in): no host synchronisation, capturable in a CUDA graph.
"""

from collections.abc import Callable

import torch
import torch.nn.functional as F

from app.kernels.choice import kernel_or_reference
from app.kernels.formats.fp8 import dequantize_blocks, dequantize_per_channel


def fp8_linear_torch(
    x: torch.Tensor, weight: torch.Tensor, scale: torch.Tensor, block: tuple[int, int] | None = None,
    glu: bool = False, residual: torch.Tensor | None = None,
) -> torch.Tensor:
    """x [T, in] @ (weight [out, in] × scale).T -> [T, out] in x's dtype (the weight dequantized in float32),
    then the epilogues."""
    if block is None:
        y = x @ dequantize_per_channel(weight, scale, x.dtype).T
    else:
        y = x @ dequantize_blocks(weight, scale, block, x.dtype).T
    return epilogue_torch(y, glu, residual)


def epilogue_torch(y: torch.Tensor, glu: bool, residual: torch.Tensor | None) -> torch.Tensor:
    """y [T, out] -> SiLU(gate) * up where `glu`, plus `residual` where given."""
    if glu:
        gate, up = y.chunk(2, dim=-1)
        y = F.silu(gate) * up
    return y if residual is None else residual + y


def fp8_linear(
    x: torch.Tensor,
    weight: torch.Tensor,
    scale: torch.Tensor,
    block: tuple[int, int] | None = None,
    tiles: tuple | None = None,
    glu: bool = False,
    residual: torch.Tensor | None = None,
    fp8_products: bool | None = None,
) -> torch.Tensor:
    """`fp8_linear_torch` in Triton; `tiles` (token side, expert_tiles.Tiles, split-K) overrides the kernel's choice,
    `fp8_products` whether a chunk runs on FP8 tensor cores (None: wherever it can)."""
    # imported here: Triton exists on Linux only, and TRITON_INTERPRET counts when its kernels are defined
    from app.kernels.fp8_linear_triton import run_fp8_linear

    return run_fp8_linear(x, weight, scale, block, tiles, glu, residual, fp8_products)


def one_token_linear(
    x: torch.Tensor, weight: torch.Tensor, glu: bool = False, residual: torch.Tensor | None = None
) -> torch.Tensor:
    """x [1, in] @ an unscaled weight [out, in].T with the epilogues, in one launch of the one-token kernel: cuBLAS's
    product leaves each epilogue a launch or two of its own (SiLU, the product, the add)."""
    from app.kernels.fp8_linear_triton import run_one_token  # Triton exists on Linux only

    return run_one_token(x, weight, None, None, glu, residual)


def fp8_linear_op(device: torch.device) -> Callable[..., torch.Tensor]:
    return kernel_or_reference(device, fp8_linear, fp8_linear_torch)
