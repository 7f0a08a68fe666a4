"""Copy missed experts from page-locked host memory into their cache slots with the whole GPU, no host.

The residency kernel (expert_resolve.py) lists the experts a layer call admits and, per expert, where each
tensor is in host memory and where its slot is. One launch copies them all, 16 bytes a lane over PCIe: a GPU
reads host memory about as fast as its copy engine copies it (bench/results/zero-copy-*.json), but only when
every request is wide and the whole chip reads, which the expert kernels reading misses in place are not.

`fetch_experts` is the Triton kernel; `fetch_experts_torch` the reference (tensors given by their addresses
are copied on the host, so it runs where host and device memory are one: the CPU).
"""

import ctypes

import torch
import triton
import triton.language as tl

from app.kernels.expert_table import row_pointer

BLOCK, STEPS = 1024, 4  # 16-byte vectors a step, steps a program: 64 KiB a program


def fetch_experts(fetched: torch.Tensor, sources: torch.Tensor, targets: torch.Tensor,
                  column_bytes: torch.Tensor, largest_column: int) -> None:
    """fetched [P] int64 experts (-1: none), sources / targets [E, C] int64 addresses of every expert's tensors,
    column_bytes [C] int64 their sizes: copy each listed expert's tensors from its sources to its targets."""
    columns = sources.shape[1]
    grid = (fetched.numel(), triton.cdiv(largest_column, BLOCK * STEPS * 16))
    _fetch_kernel[grid](fetched, sources, targets, column_bytes, column_bytes.view(torch.int32),
                        COLUMNS=columns, BLOCK=BLOCK, STEPS=STEPS)


def fetch_experts_torch(fetched: torch.Tensor, sources: torch.Tensor, targets: torch.Tensor,
                        column_bytes: torch.Tensor, largest_column: int) -> None:
    """`fetch_experts` with memmove on the host."""
    for expert in fetched.tolist():
        if expert < 0:
            continue
        for column, nbytes in enumerate(column_bytes.tolist()):
            ctypes.memmove(int(targets[expert, column]), int(sources[expert, column]), nbytes)


@triton.jit
def _fetch_kernel(fetched_ptr, sources_ptr, targets_ptr, column_bytes_ptr, words_like,
                  COLUMNS: tl.constexpr, BLOCK: tl.constexpr, STEPS: tl.constexpr):
    """Program (i, j): the j-th 64 KiB of every tensor of the i-th listed expert; the first also copies the
    bytes past a tensor's last whole 16 (tensors start 16-byte aligned: expert_table.py)."""
    expert = tl.load(fetched_ptr + tl.program_id(0))
    if expert < 0:
        return
    vector = tl.arange(0, BLOCK)
    word = tl.arange(0, 4)
    for column in tl.static_range(COLUMNS):
        nbytes = tl.load(column_bytes_ptr + column)
        source = row_pointer(sources_ptr, expert, column, COLUMNS, words_like)
        target = row_pointer(targets_ptr, expert, column, COLUMNS, words_like)
        for step in tl.static_range(STEPS):
            at = (tl.program_id(1) * STEPS + step) * BLOCK + vector  # 16-byte vectors
            whole = (at < nbytes // 16)[:, None]
            offsets = at[:, None] * 4 + word[None, :]
            tl.store(target + offsets, tl.load(source + offsets, mask=whole), mask=whole)
        if tl.program_id(1) == 0:
            tail = (nbytes // 16) * 16 + tl.arange(0, 16)
            source_bytes = source.to(tl.pointer_type(tl.uint8))
            target_bytes = target.to(tl.pointer_type(tl.uint8))
            tl.store(target_bytes + tail, tl.load(source_bytes + tail, mask=tail < nbytes), mask=tail < nbytes)
