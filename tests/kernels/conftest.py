"""Kernel tests run the Triton kernels in Triton's interpreter, on the CPU.

Triton reads TRITON_INTERPRET when it is first imported (its own library of jit functions) and
when each kernel is defined, and by the time pytest reaches this folder other tests have imported
it for real. So a run without the variable collects only the runner below, which tests this folder
again in a child pytest that has TRITON_INTERPRET=1. The variable never reaches the rest of the
suite, which keeps the torch path on the CPU. The child records its kernel launches for the parent to compile for
the H200 (launch_record.py). Tests of compiled kernels on a GPU (`*_cuda.py`, skipped
without one) run in the ordinary pytest and never in the interpreter. The C kernels' tests (`*_cpu.py`) need no
interpreter but run in the child with the rest; the fixtures below are theirs.
"""

import os
from pathlib import Path

import pytest
import torch

from app.kernels.cpu import library
from tests.kernels import launch_record
from tests.kernels.cpu_kernels import a_compiler_exists

RUNNER = "test_in_triton_interpreter.py"
LAUNCHES = "MOECHAT_KERNEL_LAUNCHES"  # where the interpreter run writes its launches, if set

CUDA_TESTS = [path.name for path in Path(__file__).parent.glob("test_*_cuda.py")]

if os.environ.get("TRITON_INTERPRET") == "1":
    collect_ignore = [RUNNER, *CUDA_TESTS]
else:
    collect_ignore = [
        path.name for path in Path(__file__).parent.glob("test_*.py") if path.name not in (RUNNER, *CUDA_TESTS)
    ]


@pytest.fixture(scope="session", autouse=True)
def recorded_launches():
    if os.environ.get("TRITON_INTERPRET") != "1" or LAUNCHES not in os.environ:
        yield
        return
    with launch_record.recording_launches() as launches:
        yield
    launch_record.write_launches(launches, Path(os.environ[LAUNCHES]))


@pytest.fixture
def built_library():
    """The CPU kernels must be built wherever a C compiler exists: an install that failed to build them must not
    pass as a machine without a compiler."""
    if library.library() is None:
        if a_compiler_exists():
            pytest.fail("a C compiler exists but the CPU expert kernels are not built: run `pip install -e .`")
        pytest.skip("no C compiler on this machine: the CPU expert kernels cannot be built")


@pytest.fixture(params=library.VECTORS)
def vector_path(request):
    """Each test on every instruction set the CPU has, the portable C included."""
    best = library.vectors()
    if library.use_vectors(request.param) != request.param:
        pytest.skip(f"this CPU has no {request.param}")
    yield request.param
    library.use_vectors(best)


@pytest.fixture(params=[1, 2])
def threads(request):
    before = torch.get_num_threads()
    torch.set_num_threads(request.param)
    yield request.param
    torch.set_num_threads(before)
