"""Where an expert kernel reads each expert's tensors: a table of device addresses, one row per expert.

A row holds one address per tensor (its columns follow the arenas' names), so a row can point into a device
cache slot or into page-locked host memory that the GPU reads over PCIe in place: the kernels read both
alike. A second table of the same shape says where a row's tensors are also written as they are read (0:
nowhere), which is how a missed expert enters a cache slot without a second trip over PCIe.

On a CPU (Triton's interpreter) an address is the tensor's own pointer; on a GPU a page-locked host tensor's
address is the one the driver maps it to, which `device_addresses` asks Triton for.
"""

from typing import NamedTuple

import torch
import triton
import triton.language as tl


class ExpertTable(NamedTuple):
    """reads [R, C] int64: the address of every tensor (column) of every row; writes [R, C] int64 or None:
    where each is copied as it is read (0: not copied)."""

    reads: torch.Tensor
    writes: torch.Tensor | None = None


def columns(arenas: dict[str, torch.Tensor]) -> tuple[str, ...]:
    """The table's column of each tensor name."""
    return tuple(arenas)


def slot_table(arenas: dict[str, torch.Tensor]) -> ExpertTable:
    """The rows of the arenas' slots: row s holds the address of slot s of every arena [S, ...]."""
    key = tuple((name, t.data_ptr(), t.shape, t.dtype) for name, t in arenas.items())
    table = _slot_tables.get(key)
    if table is None:
        first = next(iter(arenas.values()))
        slots = torch.arange(first.shape[0], dtype=torch.int64)
        reads = torch.stack([t.data_ptr() + slots * t[0].numel() * t.element_size() for t in arenas.values()], 1)
        table = _slot_tables[key] = ExpertTable(reads.to(first.device))
    return table


_slot_tables: dict[tuple, ExpertTable] = {}


def device_addresses(tensors: list[torch.Tensor], device: torch.device) -> list[int]:
    """The address at which kernels on `device` read each tensor (host tensors must be page-locked there)."""
    if device.type != "cuda":
        return [t.data_ptr() for t in tensors]
    out = torch.empty(len(tensors), dtype=torch.int64, device=device)
    for index, tensor in enumerate(tensors):
        _address_kernel[(1,)](tensor.view(torch.uint8), out[index:])
    return out.tolist()


@triton.jit
def _address_kernel(tensor_ptr, out_ptr):
    tl.store(out_ptr, tensor_ptr.to(tl.int64))


@triton.jit
def row_pointer(table_ptr, row, column, COLUMNS: tl.constexpr, like):
    """The pointer in column `column` of row `row` of a [R, COLUMNS] table, typed as the pointer `like`."""
    address = tl.load(table_ptr + row * COLUMNS + column)
    # every expert tensor starts 16-byte aligned (arena slots, the host store's 512): wide loads and stores
    return tl.multiple_of(address.to(tl.pointer_type(like.dtype.element_ty)), 16)


@triton.jit
def row_is_written(writes_ptr, row, column, COLUMNS: tl.constexpr, HAS_WRITES: tl.constexpr):
    """1 when the table `writes_ptr` copies this row's tensor in `column`, else 0 (an int: masks built from it
    stay vectors, which Triton's interpreter needs)."""
    if HAS_WRITES:
        return (tl.load(writes_ptr + row * COLUMNS + column) != 0).to(tl.int32)
    return 0
