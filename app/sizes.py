"""Byte sizes as people write them: `512K`, `300M`, `2G`, `1.5GiB`, or plain bytes.

A bare letter (K, M, G, T) is binary like in docker and llama.cpp, `KB`/`MB`/`GB` are decimal.
"""

import math
import re

from app.errors import UserError

_UNITS = {
    "": 1, "b": 1,
    "k": 1 << 10, "kb": 1000, "kib": 1 << 10,
    "m": 1 << 20, "mb": 1000**2, "mib": 1 << 20,
    "g": 1 << 30, "gb": 1000**3, "gib": 1 << 30,
    "t": 1 << 40, "tb": 1000**4, "tib": 1 << 40,
}
_PATTERN = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([a-zA-Z]*)\s*$")


def parse_size(text: str) -> int:
    match = _PATTERN.match(text)
    unit = match and match.group(2).lower()
    if not match or unit not in _UNITS:
        raise UserError(
            f"cannot read the size '{text}': write bytes or a number with a unit, e.g. 512K, 300M, 2G, 1.5GiB"
        )
    size = float(match.group(1)) * _UNITS[unit]
    if not math.isfinite(size):
        raise UserError(f"the size '{text}' is too large to be a number of bytes")
    return int(size)


def format_size(num_bytes: float) -> str:
    for unit, scale in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if abs(num_bytes) >= scale:
            return f"{num_bytes / scale:.2f} {unit}"
    return f"{int(num_bytes)} B"
