"""The CPU expert kernels: the C in this folder, built into one shared library by the package's install (setup.py)
where a C compiler exists, and called through ctypes on tensors' data pointers (no Python or torch headers: the build
needs neither, and build isolation never pulls torch). Where it was not built, `built()` is False, says why once,
and the ops run their torch references.

The structures mirror experts.h, gpt_oss_experts.c, glu_experts.c and cpu_share.c.
"""

import ctypes
import sys
from collections.abc import Callable
from functools import cache

import torch

from app.cpu_kernel_build import built_cpu_kernels

DTYPES = {torch.float32: 0, torch.bfloat16: 1, torch.uint8: 2, torch.float8_e4m3fn: 3}  # enum dtype
SCALE_LAYOUTS = {None: 0, "per_row": 1, "blocks": 2}  # enum scale_layout
STATUS = {1: "bad argument", 2: "out of memory"}  # enum status
NOT_BUILT = ("moechat: note: the CPU expert kernels were not built (no C compiler when the package was installed?): "
             "experts run on the slower torch reference; install gcc and run `pip install -e .` again")


class Arena(ctypes.Structure):
    _fields_ = [("base", ctypes.c_void_p), ("slot_bytes", ctypes.c_int64), ("dtype", ctypes.c_int32)]


class Routing(ctypes.Structure):
    _fields_ = [("tokens", ctypes.c_int64), ("picks", ctypes.c_int64), ("hidden", ctypes.c_int64),
                ("x", ctypes.c_void_p), ("slots", ctypes.c_void_p), ("weights", ctypes.c_void_p),
                ("out", ctypes.c_void_p), ("threads", ctypes.c_int32), ("team", ctypes.c_void_p)]


class GptOssExperts(ctypes.Structure):
    _fields_ = [("width", ctypes.c_int64), ("hidden", ctypes.c_int64), ("limit", ctypes.c_float),
                ("alpha", ctypes.c_float),
                *((name, Arena) for name in ("gate_up_blocks", "gate_up_scales", "gate_up_bias", "down_blocks",
                                             "down_scales", "down_bias"))]


class GluExperts(ctypes.Structure):
    _fields_ = [("width", ctypes.c_int64), ("hidden", ctypes.c_int64), ("scale_layout", ctypes.c_int32),
                ("block_rows", ctypes.c_int64), ("block_cols", ctypes.c_int64),
                ("weights", Arena * 3), ("scales", Arena * 3)]


class CpuShare(ctypes.Structure):
    _fields_ = [("control", ctypes.c_void_p), ("slots", ctypes.c_void_p), ("weights", ctypes.c_void_p),
                ("x", ctypes.c_void_p), ("out", ctypes.c_void_p), ("picks", ctypes.c_int64),
                ("hidden", ctypes.c_int64), ("threads", ctypes.c_int32), ("kernel", ctypes.c_int32),
                ("experts", ctypes.c_void_p)]


KERNELS = {"gpt_oss_experts": 0, "glu_experts": 1}  # enum kernel of cpu_share.c


@cache
def library() -> ctypes.CDLL | None:
    found = built_cpu_kernels()
    if found is None:
        return None
    lib = ctypes.CDLL(str(found))
    for name, experts in (("gpt_oss_experts", GptOssExperts), ("glu_experts", GluExperts)):
        getattr(lib, name).argtypes = [ctypes.POINTER(Routing), ctypes.POINTER(experts)]
    lib.use_vectors.argtypes = [ctypes.c_int]
    lib.serve_cpu_share.argtypes = [ctypes.POINTER(CpuShare)]
    return lib


@cache
def built() -> bool:
    if library() is None:
        print(NOT_BUILT, file=sys.stderr)
        return False
    return True


_described: dict[tuple, ctypes.Structure] = {}


def described(arenas: dict[str, torch.Tensor], describe: Callable[[], ctypes.Structure], *options) -> ctypes.Structure:
    """`describe()`, the kernel's structure for these arenas, made once: it depends on nothing but their addresses,
    layouts and `options`, which the key holds."""
    key = (*((t.data_ptr(), t.dtype, t.shape, t.stride()) for t in arenas.values()), *options)
    if key not in _described:
        _described[key] = describe()
    return _described[key]


def arena(tensor: torch.Tensor) -> Arena:
    """A tensor of every slot [S, ...], each slot contiguous (cache arenas, or views of the host store)."""
    assert tensor[0].is_contiguous() and tensor.dtype in DTYPES, f"not an arena: {tensor.dtype} {tensor.stride()}"
    return Arena(tensor.data_ptr(), tensor.stride(0) * tensor.element_size(), DTYPES[tensor.dtype])


def run(kernel: str, experts: ctypes.Structure, hidden: torch.Tensor, slots: torch.Tensor,
        weights: torch.Tensor) -> torch.Tensor:
    """The kernel on hidden [T, H], slots [T, k] (-1: skip), weights [T, k] -> [T, H] in hidden's dtype."""
    x = hidden.contiguous().float()
    slots = slots.contiguous().long()
    weights = weights.contiguous().float()
    out = torch.empty_like(x)
    routing = Routing(x.shape[0], slots.shape[1], x.shape[1], x.data_ptr(), slots.data_ptr(), weights.data_ptr(),
                      out.data_ptr(), torch.get_num_threads())
    status = getattr(library(), kernel)(ctypes.byref(routing), ctypes.byref(experts))
    if status:
        raise RuntimeError(f"the CPU kernel {kernel} failed: {STATUS.get(status, status)}")
    return out.to(hidden.dtype)


VECTORS = ("portable", "avx2", "avx512")  # enum vectors, each a superset of the one before


def vectors() -> str:
    """The instruction set the kernels use: the best this CPU has."""
    return VECTORS[library().vectors()]


def use_vectors(wanted: str) -> str:
    """Tests run every path the CPU has; the one now used: `wanted`, or the best below it."""
    return VECTORS[library().use_vectors(VECTORS.index(wanted))]
