"""A dense linear layer with an FP8 weight kept as stored: y = x @ dequant(W).T.

weight [out, in] float8_e4m3fn with its scale, [out, 1] (one per output channel, compressed-tensors;
`block` None) or [ceil(out/b0), ceil(in/b1)] (one per b0 × b1 block, `block` = (b0, b1)); x [T, in] in
bf16 / fp16 / float32 -> [T, out] in x's dtype. `fp8_linear_torch` is the reference, `fp8_linear` the Triton
kernel, `fp8_linear_op` picks one for a device.

The kernel is the expert kernels' matmul (glu_experts_triton.py) for one weight: weights are the M side of
each product (out^T = W @ x^T), so the token side of a tile is 16 at decode; FP8 weights are converted in
registers (to float16 with 16-bit activations, one instruction per two weights; float32 in the interpreter,
whose bf16 tl.dot is wrong); a per-channel scale multiplies the float32 sums once, a block scale once per
step (a step never straddles a block column); the sums stay float32 until the store.

Tiles by token count (`pick_tiles`), on GLM-4.5-Air's shapes (hidden 4096, q_proj 12288 × 4096, k/v 1024 ×
4096, o_proj 4096 × 12288, dense MLP 10944, shared expert 1408):
- T ≤ 16 (decode, a verify block) is bound by reading the weight: 16 tokens × 32 weight rows × 128 inputs per
  step, and the inputs split over several programs (split-K) until there are about two programs per SM:
  k_proj's 1024 rows make 32 row tiles, too few for 132 SMs reading 4 MB. Split partial sums are float32
  [split, T, out] added by one torch sum: deterministic, no atomics, a buffer of T × out floats per split.
- T > 16 (prefill chunks) is bound by compute: the same kernel with 64 tokens × 128 rows × 64 inputs, no
  split. Dequantizing to bf16 and calling cuBLAS instead would move 1 + 2 + 2 bytes per weight rather than 1
  and needs a bf16 copy of the weight (96 MiB for o_proj) as workspace the plan does not hold; at a 256-token
  chunk q_proj is 26 GFLOP against 50 MB of FP8, so tensor-core tiles decide the time, not the conversion.
Every launch has shapes fixed by (T, out, in): no host synchronisation, capturable in a CUDA graph.
"""

import math
from collections.abc import Callable

import torch

from app.engine.fp8 import dequantize_blocks, dequantize_per_channel
from app.kernels.choice import kernel_or_reference
from app.kernels.expert_tiles import Tiles

DECODE_TOKENS = 16  # up to a verify block: the memory-bound tiles
PROGRAMS_PER_SM = 2
MIN_STEPS_PER_SPLIT = 4  # a split reads at least 4 steps of inputs, so partial sums stay few


def fp8_linear_torch(
    x: torch.Tensor, weight: torch.Tensor, scale: torch.Tensor, block: tuple[int, int] | None = None
) -> torch.Tensor:
    """x [T, in] @ (weight [out, in] × scale).T -> [T, out] in x's dtype (the weight dequantized in float32)."""
    if block is None:
        return x @ dequantize_per_channel(weight, scale, x.dtype).T
    return x @ dequantize_blocks(weight, scale, block, x.dtype).T


def pick_tiles(tokens: int, out_features: int, in_features: int, sm_count: int) -> tuple[int, Tiles, int]:
    """(token side of a tile, weight tiles, split-K) for one launch; see the module docstring."""
    if tokens > DECODE_TOKENS:
        return 64, Tiles(128, 64, warps=8, stages=3), 1
    tiles = Tiles(32, 128, warps=4, stages=4)
    programs = math.ceil(out_features / tiles.features) * math.ceil(tokens / DECODE_TOKENS)
    steps = math.ceil(in_features / tiles.depth)
    split = min(math.ceil(PROGRAMS_PER_SM * sm_count / programs), max(steps // MIN_STEPS_PER_SPLIT, 1))
    return DECODE_TOKENS, tiles, max(split, 1)


def fp8_linear(
    x: torch.Tensor,
    weight: torch.Tensor,
    scale: torch.Tensor,
    block: tuple[int, int] | None = None,
    tiles: tuple[int, Tiles, int] | None = None,
) -> torch.Tensor:
    """`fp8_linear_torch` in Triton; `tiles` overrides `pick_tiles` (token side, weight tiles, split-K)."""
    # imported here: Triton exists on Linux only, and TRITON_INTERPRET counts when its kernels are defined
    from app.kernels.fp8_linear_triton import run_fp8_linear

    return run_fp8_linear(x, weight, scale, block, tiles)


def fp8_linear_op(device: torch.device) -> Callable[..., torch.Tensor]:
    return kernel_or_reference(device, fp8_linear, fp8_linear_torch)
