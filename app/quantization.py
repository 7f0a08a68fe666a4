"""What `quantization_config` in config.json says about the stored weights (pure Python, no torch).

FP8 checkpoints name each quantized weight `<module>.weight` (float8_e4m3fn, [out, in]) and store its
scale beside it:
- `compressed-tensors` (`float-quantized`, the GLM-4.5 / 4.7 FP8 releases): `<module>.weight_scale`
  float32 [out, 1], one scale per output channel;
- `fp8` (the GLM-5 FP8 and DeepSeek releases): `<module>.weight_scale_inv` float32
  [ceil(out / b0), ceil(in / b1)], one scale per b0 × b1 block (`weight_block_size`, [128, 128]).
Modules the config excludes are simply stored in bf16, so a weight's own dtype says whether it has a scale.
"""

import math
from dataclasses import dataclass
from pathlib import Path

from app.errors import UserError

PER_CHANNEL_SCALE = "weight_scale"
BLOCK_SCALE = "weight_scale_inv"
SUPPORTED = "mxfp4 (gpt-oss), fp8 with weight_block_size, compressed-tensors float-quantized per-channel FP8"


@dataclass(frozen=True)
class Quantization:
    method: str | None  # None: nothing is quantized
    fp8_block: tuple[int, int] | None = None  # `fp8` only

    @property
    def fp8_scale_suffix(self) -> str:
        return BLOCK_SCALE if self.fp8_block else PER_CHANNEL_SCALE

    def fp8_scale_shape(self, weight_shape: tuple[int, ...]) -> tuple[int, ...]:
        """The scale tensor an FP8 weight [..., out, in] needs."""
        *lead, rows, cols = weight_shape
        if self.fp8_block is None:
            return (*lead, rows, 1)
        return (*lead, math.ceil(rows / self.fp8_block[0]), math.ceil(cols / self.fp8_block[1]))


def is_fp8_scale(tensor_name: str) -> bool:
    return tensor_name.endswith((f".{PER_CHANNEL_SCALE}", f".{BLOCK_SCALE}"))


def read_quantization(config: dict, config_path: Path) -> Quantization:
    """Raises UserError for a method or an FP8 layout this app cannot run."""
    section = config.get("quantization_config")
    if not section:
        return Quantization(None)
    method = section.get("quant_method")
    if method == "mxfp4":
        return Quantization(method)
    if method == "fp8":
        block = section.get("weight_block_size")
        if section.get("fmt", "e4m3") != "e4m3" or not (isinstance(block, list) and len(block) == 2):
            raise UserError(
                f"{config_path} describes fp8 weights as fmt {section.get('fmt')!r} with weight_block_size "
                f"{block!r}; only e4m3 weights with two-dimensional blocks (e.g. [128, 128]) are supported"
            )
        return Quantization(method, (int(block[0]), int(block[1])))
    if method == "compressed-tensors":
        _check_compressed_tensors(section, config_path)
        return Quantization(method)
    raise UserError(f"quantization method {method!r} in {config_path} is not supported; supported: {SUPPORTED}")


def _check_compressed_tensors(section: dict, config_path: Path) -> None:
    schemes = [group.get("weights") or {} for group in (section.get("config_groups") or {}).values()]
    per_channel_fp8 = all(
        scheme.get("type") == "float" and scheme.get("num_bits") == 8 and scheme.get("strategy") == "channel"
        for scheme in schemes
    )
    if section.get("format") != "float-quantized" or not schemes or not per_channel_fp8:
        found = ", ".join(f"{s.get('type')} {s.get('num_bits')}-bit per {s.get('strategy')}" for s in schemes)
        raise UserError(
            f"compressed-tensors format {section.get('format')!r} ({found or 'no weight scheme'}) in {config_path} "
            "is not supported; only float-quantized FP8 weights with one scale per output channel are"
        )
