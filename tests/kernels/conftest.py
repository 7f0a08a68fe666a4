"""Kernel tests run the Triton kernels in Triton's interpreter, on the CPU.

Triton reads TRITON_INTERPRET when it is first imported (its own library of jit functions) and
when each kernel is defined, and by the time pytest reaches this folder other tests have imported
it for real. So a run without the variable collects only the runner below, which tests this folder
again in a child pytest that has TRITON_INTERPRET=1. The variable never reaches the rest of the
suite, which keeps the torch path on the CPU. Tests of compiled kernels on a GPU (`*_cuda.py`, skipped
without one) run in the ordinary pytest and never in the interpreter.
"""

import os
from pathlib import Path

RUNNER = "test_in_triton_interpreter.py"

CUDA_TESTS = [path.name for path in Path(__file__).parent.glob("test_*_cuda.py")]

if os.environ.get("TRITON_INTERPRET") == "1":
    collect_ignore = [RUNNER, *CUDA_TESTS]
else:
    collect_ignore = [
        path.name for path in Path(__file__).parent.glob("test_*.py") if path.name not in (RUNNER, *CUDA_TESTS)
    ]
