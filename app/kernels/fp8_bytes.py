"""FP8 e4m3 weights on GPUs that Triton gives no float8e4nv: compute capability below 8.9 (Ampere: RTX 30xx, A100).

Triton refuses to compile a kernel that names float8e4nv for those GPUs, so there the kernels take the weights' bytes
(uint8) and decode them (`weights_as`): an e4m3 byte's exponent and mantissa moved 7 bits up and its sign 8 bits up
are a float16 whose value is the e4m3 value times 2^-8, subnormals included (both formats' subnormals carry on the
normals' scale), so one multiply by 2^8 gives every e4m3 value exactly. e4m3's NaN (0x7F) would read as 480: no
checkpoint holds one.
"""

import functools
import os

import torch
import triton
import triton.language as tl

FORCE = "MOECHAT_FP8_AS_BYTES"  # "1": the bytes on any device (tests; measuring this path on a newer GPU)


def reads_fp8_as_bytes(device: torch.device) -> bool:
    if os.environ.get(FORCE) == "1":
        return True
    if device.type != "cuda":
        return False
    return _before_sm_89(torch.cuda.current_device() if device.index is None else device.index)


@functools.cache
def _before_sm_89(index: int) -> bool:
    return torch.cuda.get_device_capability(index) < (8, 9)


def goes_as_bytes(weight: torch.Tensor) -> bool:
    """Whether the kernels take `weight` as bytes: an FP8 weight where `reads_fp8_as_bytes`."""
    return weight.dtype == torch.float8_e4m3fn and reads_fp8_as_bytes(weight.device)


def for_kernels(weight: torch.Tensor) -> torch.Tensor:
    """`weight` as the kernels take it: its bytes where it `goes_as_bytes`, else itself."""
    return weight.view(torch.uint8) if goes_as_bytes(weight) else weight


@triton.jit
def weights_as(w, dtype: tl.constexpr):
    """Loaded weights in `dtype`: uint8 ones are e4m3 bytes (`for_kernels`), decoded; others converted."""
    if w.dtype == tl.uint8:
        bits = w.to(tl.uint16)
        scaled = (((bits & 0x80) << 8) | ((bits & 0x7F) << 7)).to(tl.float16, bitcast=True)  # e4m3 value * 2^-8
        return (scaled * 256.0).to(dtype)
    return w.to(dtype)
