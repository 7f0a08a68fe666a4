"""Every distinct kernel launch of an interpreter run, recorded, then compiled for the H200 (sm_90).

The interpreter checks what a kernel computes but not that the GPU compiler accepts it: a layout it cannot
convert, a dot too small for the tensor cores or a tile that needs more shared memory than an SM has only
shows on a GPU, which CI does not have. So the interpreter run records each launch's signature (pointer dtypes
and alignment, scalar kinds, constexpr values, launch options) and the parent compiles each one for sm_90 with
Triton's own ptxas, which needs no GPU.
"""

import importlib
import inspect
import json
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import torch

H200 = ("cuda", 90, 32)  # backend, compute capability, warp size
SM90_SHARED_BYTES = 232448  # the most shared memory one block may opt into on sm_90
# constexprs that the wrappers set from TRITON_INTERPRET, as a GPU launch sets them: the interpreter upcasts its
# dots (its bf16 dot is wrong) and fences nothing
ON_A_GPU = {"UPCAST": False, "FENCE": True}

_POINTEE = {
    torch.float32: "fp32", torch.float16: "fp16", torch.bfloat16: "bf16", torch.float8_e4m3fn: "fp8e4nv",
    torch.float8_e5m2: "fp8e5", torch.int64: "i64", torch.int32: "i32", torch.int16: "i16", torch.int8: "i8",
    torch.uint8: "u8", torch.bool: "i1",
}


@contextmanager
def recording_launches() -> Iterator[set[str]]:
    """The interpreter's launches while in the block, into the set it gives (one JSON text each)."""
    from triton.runtime.interpreter import InterpretedFunction

    launches, run = set(), InterpretedFunction.run

    def recording_run(self, *args, grid, warmup, **kwargs):
        launches.add(json.dumps(_launch(self.fn, args, kwargs), sort_keys=True))
        return run(self, *args, grid=grid, warmup=warmup, **kwargs)

    InterpretedFunction.run = recording_run
    try:
        yield launches
    finally:
        InterpretedFunction.run = run


def write_launches(launches: set[str], path: Path) -> None:
    path.write_text("\n".join(sorted(launches)))


def read_launches(path: Path) -> list[dict]:
    """The recorded launches, as a GPU would make them (`ON_A_GPU`), each once."""
    launches = {}
    for line in path.read_text().splitlines():
        launch = json.loads(line)
        launch["arguments"] = [[name, kind, ON_A_GPU.get(name, detail) if kind == "constexpr" else detail]
                               for name, kind, detail in launch["arguments"]]
        launches[json.dumps(launch, sort_keys=True)] = launch
    return list(launches.values())


def _launch(fn, args: tuple, kwargs: dict) -> dict:
    signature = inspect.signature(fn)
    parameters = signature.parameters
    values = signature.bind(*args, **{name: kwargs[name] for name in kwargs if name in parameters})
    values.apply_defaults()
    return {
        "module": fn.__module__,
        "kernel": fn.__name__,
        "options": {name: value for name, value in kwargs.items() if name not in parameters},
        "arguments": [[name, *_argument(value, "constexpr" in str(parameters[name].annotation))]
                      for name, value in values.arguments.items()],
    }


def _argument(value, constexpr: bool) -> list:
    if constexpr or value is None:
        if not isinstance(value, int | float | str | None):
            raise TypeError(f"a constexpr of type {type(value).__name__} cannot be recorded")
        return ["constexpr", value]
    if isinstance(value, torch.Tensor):
        return ["*" + _POINTEE[value.dtype], value.data_ptr() % 16 == 0]
    if isinstance(value, bool):
        return ["i1", False]
    if isinstance(value, int):
        return ["i32" if -2**31 <= value < 2**31 else "i64", value % 16 == 0]
    if isinstance(value, float):
        return ["fp32", False]
    raise TypeError(f"an argument of type {type(value).__name__} cannot be recorded")


def compile_for_h200(launch: dict) -> str | None:
    """Compiles one recorded launch for sm_90; None where it compiles within the SM's shared memory, else why not."""
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    kernel = getattr(importlib.import_module(launch["module"]), launch["kernel"])
    signature, constants, attributes = {}, {}, {}
    for index, (name, kind, detail) in enumerate(launch["arguments"]):
        signature[name] = kind
        if kind == "constexpr":
            constants[(index,)] = detail
        elif detail:
            attributes[(index,)] = [["tt.divisibility", 16]]
    try:
        compiled = triton.compile(ASTSource(kernel, signature, constants, attributes), target=GPUTarget(*H200),
                                  options=launch["options"])
    except Exception as error:  # any compiler error is the finding
        return f"{type(error).__name__}: {str(error)[-1500:]}"
    if compiled.metadata.shared > SM90_SHARED_BYTES:
        return f"needs {compiled.metadata.shared} bytes of shared memory, sm_90 has {SM90_SHARED_BYTES}"
    return None
