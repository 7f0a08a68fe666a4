"""Tensors of a model folder as memory-mapped torch views: nothing is read until it is used."""

import numpy as np
import torch

from app.errors import UserError
from app.kernels.formats.fp8 import dequantize
from app.model_folder import ModelFolder, TensorInfo

TORCH_DTYPES = {
    "BOOL": torch.bool, "U8": torch.uint8, "I8": torch.int8, "I16": torch.int16, "I32": torch.int32,
    "I64": torch.int64, "F16": torch.float16, "BF16": torch.bfloat16, "F32": torch.float32,
    "F64": torch.float64, "F8_E4M3": torch.float8_e4m3fn, "F8_E5M2": torch.float8_e5m2,
}
FLOAT_DTYPES = ("F16", "BF16", "F32", "F64", "F8_E4M3", "F8_E5M2")
WHOLE_CHECK_ELEMENTS = 1 << 20  # tensors up to this size (norms, routers, biases) are checked whole
SAMPLE_ELEMENTS = 1 << 14  # a larger tensor is checked at its start, middle and end, this many elements each


class Checkpoint:
    """Tensors checked against the shapes a model expects."""

    def __init__(self, folder: ModelFolder):
        self.folder = folder
        self._maps: dict[str, np.memmap] = {}

    def has(self, name: str) -> bool:
        return name in self.folder.tensors

    def info(self, name: str) -> TensorInfo:
        info = self.folder.tensors.get(name)
        if info is None:
            raise UserError(f"tensor '{name}' is missing from the checkpoint in '{self.folder.path}'")
        return info

    def tensor(self, name: str, shape: tuple[int, ...] | None = None) -> torch.Tensor:
        """A zero-copy view of the file's bytes (copy-on-write mapping, so the file is never changed)."""
        info = self.info(name)
        if shape is not None and tuple(shape) != info.shape:
            raise UserError(
                f"tensor '{name}' has shape {list(info.shape)} but this config needs {list(shape)}: "
                "the weights do not match config.json"
            )
        dtype = TORCH_DTYPES.get(info.dtype)
        if dtype is None:
            raise UserError(f"tensor '{name}' has dtype {info.dtype}, which this app cannot read")
        raw = torch.from_numpy(self._map(info)[info.offset : info.offset + info.nbytes])
        if info.offset % raw.new_empty((), dtype=dtype).element_size():
            raw = raw.clone()  # a misaligned tensor cannot be viewed in place
        return raw.view(dtype).reshape(info.shape)

    def elements(self, name: str, start: int, count: int) -> torch.Tensor:
        """Elements [start, start + count) of a tensor in storage order, as a copy of just those bytes."""
        info = self.info(name)
        dtype = TORCH_DTYPES[info.dtype]
        size = torch.empty((), dtype=dtype).element_size()
        raw = self._map(info)[info.offset + start * size : info.offset + (start + count) * size]
        return torch.from_numpy(raw.copy()).view(dtype)

    def _map(self, info: TensorInfo) -> np.memmap:
        key = str(info.file)
        if key not in self._maps:
            self._maps[key] = np.memmap(info.file, dtype=np.uint8, mode="c")
        return self._maps[key]

    def stored_weight(self, module: str, shape: tuple[int, ...]) -> dict[str, torch.Tensor]:
        """{"weight"}, plus "weight_scale" or "weight_scale_inv" for FP8 (the keys `fp8.dequantize` reads)."""
        weight = self.tensor(f"{module}.weight", shape)
        if weight.dtype != torch.float8_e4m3fn:
            return {"weight": weight}
        quantization = self.folder.quantization
        if quantization.method not in ("fp8", "compressed-tensors"):
            raise UserError(
                f"tensor '{module}.weight' is FP8 but config.json declares no FP8 quantization_config, "
                "so its scales cannot be read: the weights do not match config.json"
            )
        suffix, expected = quantization.fp8_scale_suffix, quantization.fp8_scale_shape(shape)
        scale_name = f"{module}.{suffix}"
        if self.info(scale_name).shape != expected:
            layout = f"{quantization.fp8_block[0]}×{quantization.fp8_block[1]} blocks" if quantization.fp8_block \
                else "one scale per output channel"
            raise UserError(
                f"FP8 scale '{scale_name}' has shape {list(self.info(scale_name).shape)} but a {list(shape)} weight "
                f"with {layout} needs {list(expected)}: the weights do not match config.json"
            )
        return {"weight": weight, suffix: self.tensor(scale_name, expected)}

    def loader(self, device: torch.device, dtype: torch.dtype, prefix: str = ""):
        """`load(name, shape, keep_float32=False)`: a shape-checked weight on `device` in `dtype`."""

        def load(name: str, shape: tuple[int, ...], keep_float32: bool = False) -> torch.Tensor:
            return self.tensor(prefix + name, shape).to(device, torch.float32 if keep_float32 else dtype)

        return load

    def dequantized(
        self, module: str, shape: tuple[int, ...], device: torch.device, dtype: torch.dtype
    ) -> torch.Tensor:
        """`{module}.weight` on `device` in `dtype`; FP8 weights travel as FP8 and are scaled there."""
        stored = {name: tensor.to(device) for name, tensor in self.stored_weight(module, shape).items()}
        return dequantize(stored, self.folder.quantization.fp8_block, dtype)


def check_finite(checkpoint: Checkpoint) -> None:
    """NaN or infinity means a damaged file (greedy decoding would emit token 0 for ever). Small tensors are read
    whole, larger ones at three places."""
    for name, info in checkpoint.folder.tensors.items():
        if info.dtype not in FLOAT_DTYPES:
            continue  # integer-coded weights (MXFP4 blocks and scales) hold no NaN
        count, n = info.numel, SAMPLE_ELEMENTS
        samples = [(0, count)] if count <= WHOLE_CHECK_ELEMENTS else [(0, n), ((count - n) // 2, n), (count - n, n)]
        if not all(torch.isfinite(checkpoint.elements(name, start, size).float()).all() for start, size in samples):
            raise UserError(f"tensor '{name}' in {info.file} holds NaN or infinite values: the weights are damaged; "
                            "download the model again")
