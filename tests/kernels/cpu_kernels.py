"""What the CPU kernel tests share (their fixtures are in conftest.py)."""

import shutil
import sysconfig

import torch


def a_compiler_exists() -> bool:
    compiler = (sysconfig.get_config_var("CC") or "cc").split()[0]
    return shutil.which(compiler) is not None or shutil.which("cc") is not None


def in_strided_slots(arenas: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """The same arenas with room between their slots, as views of the host store have (each slot contiguous)."""
    spread = {}
    for name, arena in arenas.items():
        room = torch.zeros((arena.shape[0], 3, *arena.shape[1:]), dtype=arena.dtype)
        room[:, 1] = arena
        spread[name] = room[:, 1]
    return spread
