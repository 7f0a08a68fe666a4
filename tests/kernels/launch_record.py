"""Every distinct kernel launch of an interpreter run, recorded, then compiled for the H200 (sm_90) and for a GPU
before sm_89 (an RTX 3090, sm_86).

The interpreter checks what a kernel computes but not that the GPU compiler accepts it: a layout it cannot
convert, a dot too small for the tensor cores, a dtype the GPU lacks or a tile that needs more shared memory than
an SM has only shows on a GPU, which CI does not have. So the interpreter run records each launch's signature
(pointer dtypes and alignment, scalar kinds, constexpr values, launch options) and the parent compiles each one
with Triton's own ptxas, which needs no GPU. A desktop card's block may have 99 KB of shared memory (sm_86, sm_89,
sm_120), the H200's 227 KB.
"""

import importlib
import inspect
import json
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import torch

# backend, compute capability, warp size; the most shared memory one block may opt into
H200, H200_SHARED_BYTES = ("cuda", 90, 32), 232448
RTX_3090, RTX_3090_SHARED_BYTES = ("cuda", 86, 32), 101376
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


def made_on_ampere(launch: dict) -> bool:
    """Whether a GPU before sm_89 makes this launch: one without float8e4nv, which Triton lacks there (its FP8
    weights go as bytes, fp8_bytes.py)."""
    return all(kind != "*fp8e4nv" for _, kind, _ in launch["arguments"])


def takes_fp8_bytes(launch: dict) -> bool:
    """Whether the launch's weights are FP8 bytes (`fp8_bytes.for_kernels`)."""
    return any(name in ("weight_ptr", "gate_ptr") and kind == "*u8" for name, kind, _ in launch["arguments"])


def compile_for_h200(launch: dict) -> str | None:
    """Compiles one recorded launch for sm_90 as an H200 launches it (`as_on_hopper`); None where it compiles within
    the SM's shared memory, else why not."""
    return compile_for(as_on_hopper(launch), H200, H200_SHARED_BYTES)


def as_on_hopper(launch: dict) -> dict:
    """A recorded launch as a GPU of sm_90 or later makes it: dependent (PDL true, launch_pdl; dependent_launch.py)
    where the kernel takes a PDL constant, which the interpreter's launches leave false."""
    if not any(name == "PDL" for name, _, _ in launch["arguments"]):
        return launch
    arguments = [[name, kind, True if name == "PDL" else detail] for name, kind, detail in launch["arguments"]]
    return dict(launch, options=dict(launch["options"], launch_pdl=True), arguments=arguments)


def compile_for_rtx_3090(launch: dict) -> str | None:
    """`compile_for_h200` for sm_86."""
    return compile_for(launch, RTX_3090, RTX_3090_SHARED_BYTES)


def compile_for(launch: dict, target: tuple[str, int, int], shared_bytes: int) -> str | None:
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
        compiled = triton.compile(ASTSource(kernel, signature, constants, attributes), target=GPUTarget(*target),
                                  options=launch["options"])
    except Exception as error:  # any compiler error is the finding
        return f"{type(error).__name__}: {str(error)[-1500:]}"
    if compiled.metadata.shared > shared_bytes:
        return f"needs {compiled.metadata.shared} bytes of shared memory, sm_{target[1]} has {shared_bytes}"
    return None
