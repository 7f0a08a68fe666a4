"""The SiLU-gated MLP, as GLU experts (the kernels' references) and dense MLPs (the engine's layers) compute it."""

from collections.abc import Callable

import torch
import torch.nn.functional as F


def silu_glu(x: torch.Tensor, gate, up, down, linear: Callable = F.linear) -> torch.Tensor:
    """x [T, in], gate/up [W, in], down [out, W] (rows are output features) -> [T, out]. `linear(x, weight)`
    multiplies by one of the weights: the engine's also takes FP8 weights kept as the checkpoint stores them."""
    return linear(F.silu(linear(x, gate)) * linear(x, up), down)
