"""Rotary position embeddings: plain and YaRN frequencies and their cos/sin tables; the rotations (by halves, whole
or partial, or by interleaved pairs) are app/kernels/rotary_cache.py's."""

import math

import torch

from app.kernels.rope_angles import rope_angles_op


def rope_frequencies(rotary_dim: int, theta: float, scaling: dict | None) -> tuple[torch.Tensor, float]:
    """(inverse frequencies [rotary_dim / 2], attention factor that multiplies cos and sin)."""
    exponents = torch.arange(0, rotary_dim, 2, dtype=torch.float32) / rotary_dim
    inv_freq = 1.0 / theta**exponents
    if not scaling or scaling.get("rope_type", scaling.get("type")) in (None, "default"):
        return inv_freq, 1.0
    if scaling.get("rope_type", scaling.get("type")) != "yarn":
        raise ValueError(f"unsupported rope scaling {scaling}")
    return _yarn(inv_freq, rotary_dim, theta, scaling)


def _yarn(inv_freq: torch.Tensor, dim: int, theta: float, scaling: dict) -> tuple[torch.Tensor, float]:
    factor = scaling["factor"]
    original = scaling["original_max_position_embeddings"]
    attention_factor = scaling.get("attention_factor")
    if attention_factor is None:
        mscale, mscale_all_dim = scaling.get("mscale"), scaling.get("mscale_all_dim")
        if mscale and mscale_all_dim:
            attention_factor = _yarn_mscale(factor, mscale) / _yarn_mscale(factor, mscale_all_dim)
        else:
            attention_factor = _yarn_mscale(factor, 1.0)

    def correction_dim(rotations: float) -> float:
        return dim * math.log(original / (rotations * 2 * math.pi)) / (2 * math.log(theta))

    low = correction_dim(scaling.get("beta_fast") or 32)
    high = correction_dim(scaling.get("beta_slow") or 1)
    if scaling.get("truncate", True):
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, dim - 1)
    if low == high:
        high += 0.001
    ramp = ((torch.arange(dim // 2, dtype=torch.float32) - low) / (high - low)).clamp(0, 1)
    extrapolation = 1 - ramp
    inv_freq = (inv_freq / factor) * (1 - extrapolation) + inv_freq * extrapolation
    return inv_freq, float(attention_factor)


def _yarn_mscale(scale: float, mscale: float) -> float:
    return 1.0 if scale <= 1 else 0.1 * mscale * math.log(scale) + 1.0


class Rotary:
    """cos/sin tables for given positions."""

    def __init__(self, rotary_dim: int, theta: float, scaling: dict | None, device: torch.device):
        inv_freq, self.attention_factor = rope_frequencies(rotary_dim, theta, scaling)
        self.inv_freq = inv_freq.to(device)
        self.angles = rope_angles_op(device)

    def cos_sin(self, positions: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        """positions [T] -> cos, sin [T, rotary_dim / 2], times the attention factor."""
        return self.angles(positions, self.inv_freq, self.attention_factor, dtype)
