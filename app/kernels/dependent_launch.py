"""Programmatic dependent launch (Hopper and later) for the decode step's kernels.

A resident decode step is some fifteen small launches a layer, and without it each waits for the one before it to
finish and its writes to flush before the GPU schedules its programs. Launched with `dependent_launch(device)`'s
options, a kernel's programs are scheduled as the kernel before it ends and wait in `after_earlier_kernels` (the
kernel's first statement) until that kernel has finished and its writes are visible; each such kernel also lets the
next one launch once all its own programs run. CUDA graphs keep the dependencies when they capture such launches.
MOECHAT_PDL=0 launches them as before (to measure the difference in one run).

Reading ahead: a kernel launched so writes no memory before that statement, and reads before it only what no kernel
of the step writes (weights; `prefetch_rows_to_l2` asks for them to be brought into L2) or, where the kernel before it
waits before it lets this one launch (`NEXT_READS_AHEAD`), what the kernels two or more launches back wrote (the
picks of a router two launches back): this one's programs then start only once all of that kernel's have passed
their wait, so those kernels have finished. A kernel's weights so come from memory while the kernel before it still
runs, instead of after it: a one-token product is bound by DRAM's latency, and so is the tail of the one before it.
Such reads go to L2 (`.cg`), which holds what finished kernels wrote (an SM's L1 is not kept coherent).
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
def after_earlier_kernels(PDL: tl.constexpr, NEXT_READS_AHEAD: tl.constexpr = False):
    """Where the kernel was launched with PDL: lets the next kernel launch, then waits until the kernels launched
    before this one have finished and their writes are visible. With NEXT_READS_AHEAD it waits first, so that the
    next kernel may read what the kernels before this one wrote before its own wait (the module's reading ahead)."""
    if PDL:
        if NEXT_READS_AHEAD:
            gdc_wait()
            gdc_launch_dependents()
        else:
            gdc_launch_dependents()
            gdc_wait()


@triton.jit
def prefetch_rows_to_l2(rows, ROW_BYTES: tl.constexpr, PDL: tl.constexpr, THREADS: tl.constexpr):
    """Where the kernel was launched with PDL, asks the SM's TMA unit to bring a program's block of a weight into L2:
    the bytes from the lowest of the pointers `rows` (rows that follow one another in one allocation) to ROW_BYTES
    past the highest, in one bulk prefetch (sm_90) from the program's first thread, for a kernel to call before
    `after_earlier_kernels`. THREADS: the program's threads, 32 a warp. Only the 16-byte words wholly inside the
    range are asked for (the bulk copy's alignment)."""
    if PDL:
        addresses = rows.to(tl.int64, bitcast=True)
        first = (tl.min(addresses, axis=0) + 15) // 16 * 16
        end = (tl.max(addresses, axis=0) + ROW_BYTES) // 16 * 16
        thread = tl.arange(0, THREADS)  # one element a thread: the request goes out once
        sizes = tl.where(thread == 0, tl.maximum(end - first, 0), 0).to(tl.int32)
        tl.inline_asm_elementwise(
            "{ .reg .pred p; setp.ne.s32 p, $2, 0; @p cp.async.bulk.prefetch.L2.global [$1], $2; mov.u32 $0, 0; }",
            "=r,l,r", [first + tl.zeros((THREADS,), tl.int64), sizes], dtype=tl.int32, is_pure=False, pack=1)
