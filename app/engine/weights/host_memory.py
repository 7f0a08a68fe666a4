"""The host copies of routed experts in one allocation, page-locked in place when a GPU copies from it: torch's
pinned allocator rounds up to a power of two (an 8.3 MB expert would lock 16 MB), one exact allocation does not.
"""

import weakref

import torch

from app.errors import UserError
from app.sizes import format_size

ALIGN = 512  # bytes: every tensor starts on a boundary that suits any dtype and the copy engines
# cudaHostRegisterPortable | cudaHostRegisterMapped: every GPU may copy from it, and kernels read it in place
REGISTER_FLAGS = 1 | 2


def aligned_bytes(tensors) -> int:
    """Bytes the tensors take in a `HostArena`."""
    return sum(_aligned(t.numel() * t.element_size()) for t in tensors)


def _aligned(nbytes: int) -> int:
    return -(-nbytes // ALIGN) * ALIGN


class HostArena:
    """`nbytes` of host memory handed out front to back as tensor copies."""

    def __init__(self, nbytes: int, pin: bool):
        self.buffer = torch.empty(nbytes, dtype=torch.uint8)
        self.offset = 0
        if pin and nbytes:
            _page_lock(self, self.buffer)

    def copy_of(self, tensor: torch.Tensor) -> torch.Tensor:
        nbytes = tensor.numel() * tensor.element_size()
        if self.offset + nbytes > len(self.buffer):
            raise ValueError(f"the arena of {len(self.buffer)} bytes is full")
        copy = self.buffer[self.offset : self.offset + nbytes].view(tensor.dtype).view(tensor.shape)
        copy.copy_(tensor)
        self.offset += _aligned(nbytes)
        return copy


def _page_lock(owner: object, buffer: torch.Tensor) -> None:
    """Copies from it then run asynchronously at full link speed, and kernels read it over PCIe; until `owner`
    is gone."""
    cudart = torch.cuda.cudart()
    pointer, nbytes = buffer.data_ptr(), buffer.numel()
    error = cudart.cudaHostRegister(pointer, nbytes, REGISTER_FLAGS)
    if int(error) != 0:
        raise UserError(f"could not lock {format_size(nbytes)} of host memory for the experts (CUDA error "
                        f"{int(error)}): lower the RAM budget or close other programs")
    weakref.finalize(owner, cudart.cudaHostUnregister, pointer)
