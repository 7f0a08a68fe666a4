"""Where an expert kernel reads each expert's tensors: a table of device addresses [R, C] int64, one row per
expert, one column per tensor (following the arenas' names).

A row can point into a device cache slot or into page-locked host memory, which the GPU then reads over PCIe in
place: the kernels read both alike. On a CPU (Triton's interpreter) an address is the tensor's own pointer; on a
GPU a page-locked host tensor's address is the one the driver maps it to, which `device_addresses` asks Triton
for.
"""

import torch
import triton
import triton.language as tl


def columns(arenas: dict[str, torch.Tensor]) -> tuple[str, ...]:
    """The table's column of each tensor name."""
    return tuple(arenas)


def slot_table(arenas: dict[str, torch.Tensor]) -> torch.Tensor:
    """The table of the arenas' slots: row s holds the address of slot s of every arena [S, ...]."""
    key = tuple((name, t.data_ptr(), t.shape, t.dtype) for name, t in arenas.items())
    table = _slot_tables.get(key)
    if table is None:
        first = next(iter(arenas.values()))
        slots = torch.arange(first.shape[0], dtype=torch.int64)
        table = torch.stack([t.data_ptr() + slots * t[0].numel() * t.element_size() for t in arenas.values()], 1)
        table = _slot_tables[key] = table.to(first.device)
    return table


_slot_tables: dict[tuple, torch.Tensor] = {}


def address_row(tensors: dict[str, torch.Tensor], arenas: dict[str, torch.Tensor]) -> torch.Tensor | None:
    """A table row [1, C] for one expert kept outside the arenas (GLM's shared expert), whose tensors have the
    names, shapes and dtypes of one slot of `arenas`; None where they do not, or where one starts off 16 bytes."""
    first = next(iter(arenas.values()))
    if set(tensors) != set(arenas) or any(
        t.shape != arenas[name].shape[1:] or t.dtype != arenas[name].dtype or t.device != first.device
        or not t.is_contiguous() or t.data_ptr() % 16 for name, t in tensors.items()
    ):
        return None
    return torch.tensor([[tensors[name].data_ptr() for name in columns(arenas)]], dtype=torch.int64,
                        device=first.device)


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
    return _typed(tl.load(table_ptr + row * COLUMNS + column), like)


@triton.jit
def row_or_own_pointer(table_ptr, row, own_ptr, is_own, column, COLUMNS: tl.constexpr, like):
    """`row_pointer` of row `row` (>= 0), or where `is_own` the one in column `column` of the one-row table
    `own_ptr` (an expert outside the table, as `address_row` gives it)."""
    address = tl.where(is_own, tl.load(own_ptr + column), tl.load(table_ptr + row * COLUMNS + column))
    return _typed(address, like)


@triton.jit
def _typed(address, like):
    # every expert tensor starts 16-byte aligned (arena slots, the host store's 512, `address_row`'s check): wide
    # loads and stores
    return tl.multiple_of(address.to(tl.pointer_type(like.dtype.element_ty)), 16)
