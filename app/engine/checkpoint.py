"""Tensors of a model folder as memory-mapped torch views: nothing is read until it is used."""

import numpy as np
import torch

from app.errors import UserError
from app.model_folder import ModelFolder, TensorInfo

TORCH_DTYPES = {
    "BOOL": torch.bool, "U8": torch.uint8, "I8": torch.int8, "I16": torch.int16, "I32": torch.int32,
    "I64": torch.int64, "F16": torch.float16, "BF16": torch.bfloat16, "F32": torch.float32,
    "F64": torch.float64, "F8_E4M3": torch.float8_e4m3fn, "F8_E5M2": torch.float8_e5m2,
}


class Checkpoint:
    """Read-only access to the tensors of a `ModelFolder`, checked against the shapes a model expects."""

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
        key = str(info.file)
        if key not in self._maps:
            self._maps[key] = np.memmap(info.file, dtype=np.uint8, mode="c")
        raw = torch.from_numpy(self._maps[key][info.offset : info.offset + info.nbytes])
        if info.offset % raw.new_empty((), dtype=dtype).element_size():
            raw = raw.clone()  # a misaligned tensor cannot be viewed in place
        return raw.view(dtype).reshape(info.shape)
