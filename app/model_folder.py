"""A model folder in Hugging Face layout, read without loading weights (pure Python, no torch).

It reads `config.json`, `generation_config.json` and the safetensors headers (through
`model.safetensors.index.json` when the checkpoint is sharded), and checks that every file is there
and complete, so that the planner and the engine can trust names, shapes and byte offsets.
"""

import json
import struct
from dataclasses import dataclass
from pathlib import Path

from app.errors import UserError
from app.quantization import read_quantization

SUPPORTED_MODEL_TYPES = ("gpt_oss", "glm4_moe", "glm4_moe_lite", "glm_moe_dsa")
INDEX_FILE = "model.safetensors.index.json"
DTYPE_BYTES = {
    "BOOL": 1, "U8": 1, "I8": 1, "F8_E4M3": 1, "F8_E5M2": 1, "F8_E8M0": 1,
    "U16": 2, "I16": 2, "F16": 2, "BF16": 2,
    "U32": 4, "I32": 4, "F32": 4,
    "U64": 8, "I64": 8, "F64": 8,
}
_REDOWNLOAD = "download the model again or pick another folder"


@dataclass(frozen=True)
class TensorInfo:
    name: str
    dtype: str
    shape: tuple[int, ...]
    file: Path
    offset: int  # absolute byte offset of the data in `file`
    nbytes: int

    @property
    def numel(self) -> int:
        count = 1
        for dim in self.shape:
            count *= dim
        return count


class ModelFolder:
    """Config, generation config and tensor table of one model folder."""

    def __init__(self, path: Path, config: dict, generation_config: dict, tensors: dict[str, TensorInfo]):
        self.path = path
        self.config = config
        self.generation_config = generation_config
        self.tensors = tensors
        self.quantization = read_quantization(config, path / "config.json")

    @classmethod
    def open(cls, path: str | Path, any_model_type: bool = False) -> "ModelFolder":
        """`any_model_type` admits folders that are not targets (a drafter's `model_type` varies)."""
        path = Path(path)
        if path.is_file():
            raise UserError(f"'{path}' is a file: give the model's folder (the one holding config.json)")
        if not path.is_dir():
            raise UserError(f"model folder '{path}' does not exist")
        config = _read_json(path / "config.json", required=True)
        model_type = config.get("model_type")
        if not any_model_type and model_type not in SUPPORTED_MODEL_TYPES:
            raise UserError(
                f"model type '{model_type}' in {path / 'config.json'} is not supported; "
                f"supported: {', '.join(SUPPORTED_MODEL_TYPES)}"
            )
        return cls(path, config, read_generation_config(path), _read_tensor_table(path))

    @property
    def model_type(self) -> str:
        return self.config["model_type"]

    @property
    def max_positions(self) -> int | None:
        """The longest sequence the model was made for, when config.json says (max_position_embeddings)."""
        value = self.config.get("max_position_embeddings")
        return value if isinstance(value, int) and value > 0 else None

    def check_context(self, tokens: int, what: str) -> None:
        """Refuse `tokens` of context (named `what` in the message) past what the model was made for."""
        if self.max_positions is not None and tokens > self.max_positions:
            raise UserError(f"{what} {tokens} is more than this model's context ({self.max_positions} tokens, "
                            "max_position_embeddings in config.json)")

    def stop_token_ids(self) -> list[int]:
        ids: list[int] = []
        for source in (self.generation_config, self.config):
            value = source.get("eos_token_id")
            for token in value if isinstance(value, list) else [value]:
                if isinstance(token, int) and token not in ids:
                    ids.append(token)
        return ids


def read_generation_config(folder: str | Path) -> dict:
    """The folder's `generation_config.json` (sampling defaults, stop tokens); {} when it has none."""
    return _read_json(Path(folder) / "generation_config.json", required=False)


def _read_json(path: Path, required: bool) -> dict:
    if not path.is_file():
        if required:
            raise UserError(f"{path.name} is missing in '{path.parent}': this is not a Hugging Face model folder")
        return {}
    try:
        content = json.loads(path.read_text())
    except OSError as error:
        raise UserError(f"cannot read {path}: {error.strerror}") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as error:
        raise UserError(f"{path} is not valid JSON ({error}): {_REDOWNLOAD}") from None
    if not isinstance(content, dict):
        raise UserError(f"{path} holds a JSON {type(content).__name__} where an object {{...}} belongs: {_REDOWNLOAD}")
    return content


def _read_tensor_table(folder: Path) -> dict[str, TensorInfo]:
    index_path = folder / INDEX_FILE
    if index_path.is_file():
        weight_map = _read_json(index_path, required=True).get("weight_map", {})
        if not isinstance(weight_map, dict) or not all(isinstance(v, str) for v in weight_map.values()):
            raise UserError(f"the weight_map in {index_path} is not a table of tensor names to files: {_REDOWNLOAD}")
        files = sorted(set(weight_map.values()))
    else:
        weight_map = None
        files = sorted(p.name for p in folder.glob("*.safetensors"))
    if not files:
        raise UserError(f"no *.safetensors files in '{folder}': {_REDOWNLOAD}")
    tensors: dict[str, TensorInfo] = {}
    for name in files:
        tensors.update(read_safetensors_header(folder / name))
    if weight_map is not None:
        for tensor_name, file_name in weight_map.items():
            info = tensors.get(tensor_name)
            if info is None or info.file.name != file_name:
                raise UserError(f"tensor '{tensor_name}' listed in {INDEX_FILE} is not in {file_name}: {_REDOWNLOAD}")
    return tensors


def read_safetensors_header(path: Path) -> dict[str, TensorInfo]:
    if not path.is_file():
        raise UserError(f"checkpoint file {path.name} is missing in '{path.parent}': {_REDOWNLOAD}")
    header, data_start, file_size = _read_header(path)
    tensors = {}
    for name, entry in header.items():
        if name == "__metadata__":
            continue
        if not _well_formed(entry):
            raise UserError(f"tensor '{name}' in {path.name} has a malformed header entry: {_REDOWNLOAD}")
        begin, end = entry["data_offsets"]
        shape = tuple(entry["shape"])
        info = TensorInfo(name, entry["dtype"], shape, path, data_start + begin, end - begin)
        if info.dtype not in DTYPE_BYTES or info.numel * DTYPE_BYTES[info.dtype] != info.nbytes:
            raise UserError(f"tensor '{name}' in {path.name} has an inconsistent header entry: {_REDOWNLOAD}")
        if data_start + end > file_size:
            raise UserError(
                f"checkpoint file {path} is truncated ({file_size} bytes, needs {data_start + end}): {_REDOWNLOAD}"
            )
        tensors[name] = info
    return tensors


def _read_header(path: Path) -> tuple[dict, int, int]:
    """A safetensors file's JSON header, where its data starts, and the file's size."""
    try:
        file_size = path.stat().st_size
        with path.open("rb") as handle:
            prefix = handle.read(8)
            header_size = struct.unpack("<Q", prefix)[0] if len(prefix) == 8 else -1
            if header_size < 2 or 8 + header_size > file_size:
                raise UserError(f"checkpoint file {path} is truncated or not a safetensors file: {_REDOWNLOAD}")
            text = handle.read(header_size)
    except OSError as error:
        raise UserError(f"cannot read {path}: {error.strerror}") from None
    try:
        header = json.loads(text)
    except (json.JSONDecodeError, UnicodeDecodeError):
        raise UserError(f"checkpoint file {path} has a corrupt header: {_REDOWNLOAD}") from None
    if not isinstance(header, dict):
        raise UserError(f"checkpoint file {path} has a corrupt header: {_REDOWNLOAD}")
    return header, 8 + header_size, file_size


def _well_formed(entry) -> bool:
    """A header entry: {"dtype": str, "shape": [int ≥ 0, ...], "data_offsets": [begin, end]}."""
    if not isinstance(entry, dict) or not isinstance(entry.get("dtype"), str):
        return False
    shape, offsets = entry.get("shape"), entry.get("data_offsets")
    return (isinstance(shape, list) and all(map(_natural, shape)) and isinstance(offsets, list)
            and len(offsets) == 2 and all(map(_natural, offsets)) and offsets[0] <= offsets[1])


def _natural(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0
