"""Programmatic dependent launch (Hopper and later) for the decode step's kernels.

A resident decode step is some fifteen small launches a layer, and without it each waits for the one before it to
finish and its writes to flush before the GPU schedules its programs. Launched with `dependent_launch(device)`'s
options, a kernel's programs are scheduled as the kernel before it ends and wait in `after_earlier_kernels` (the
kernel's first statement) until that kernel has finished and its writes are visible; each such kernel also lets the
next one launch once all its own programs run. A kernel launched so must read and write no memory before that
statement. CUDA graphs keep the dependencies when they capture such launches. MOECHAT_PDL=0 launches them as before
(to measure the difference in one run).

A kernel that starts with `after_earlier_kernels_only` waits the same way but does not let the next kernel launch
early: the next one launches as it ends. The one-token products that stream a layer's weights take it (gpt-oss's
MXFP4 experts, the FP8 / 16-bit single-token dense products): with the next kernel's programs placed on the
multiprocessors while they ran, the MXFP4 op took 28.5-28.7 us a layer against 26.2-26.5 and GLM-4.5-Air-FP8's
4-layer step 1050-1053 us against 980-982; gpt-oss-20b decoded 488 tok/s against 506-509 (H100, bench/NOTES.md,
thirty-first session). GLM's one-token GLU experts keep `after_earlier_kernels` (984-985 us with it taken out).
"""

import functools
import os

import torch
import triton
import triton.language as tl
from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait


def dependent_launch(device: torch.device) -> dict:
    """The launch options of a kernel that calls `after_earlier_kernels`: PDL on CUDA devices of compute capability 9
    and later (the kernel's PDL constant, and Triton's launch_pdl), off elsewhere."""
    return {"PDL": True, "launch_pdl": True} if _launches_dependent(device) else {"PDL": False}


@functools.cache
def _launches_dependent(device: torch.device) -> bool:
    return (device.type == "cuda" and torch.cuda.get_device_capability(device)[0] >= 9
            and os.environ.get("MOECHAT_PDL", "1") != "0")


@triton.jit
def after_earlier_kernels(PDL: tl.constexpr):
    """Where the kernel was launched with PDL: lets the next kernel launch, then waits until the kernels launched
    before this one have finished and their writes are visible."""
    if PDL:
        gdc_launch_dependents()
    after_earlier_kernels_only(PDL)


@triton.jit
def after_earlier_kernels_only(PDL: tl.constexpr):
    """Where the kernel was launched with PDL: waits until the kernels launched before this one have finished and
    their writes are visible; the next kernel launches when this one has finished."""
    if PDL:
        gdc_wait()
