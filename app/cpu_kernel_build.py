"""Where the package's install put the CPU expert kernels' shared library (setup.py builds it where a C compiler
exists; app/kernels/cpu/library.py loads it), found without importing torch, so that the planner and the desktop app
know whether the CPU expert tier can run."""

from functools import cache
from pathlib import Path

KERNELS = Path(__file__).parent / "kernels" / "cpu"


@cache  # the planner asks at every prediction (a slider's every step); the install does not change under a run
def built_cpu_kernels() -> Path | None:
    """The library, None where the install built none."""
    return next(iter(sorted(KERNELS.glob("_experts.*.so"))), None)
