"""A static KV cache: preallocated per layer, filled front to back, rewound by `truncate(n)`."""

import torch

from app.errors import UserError


class KVCache:
    """Named per-token entries (e.g. "k", "v" [kv_heads, head_dim], MLA's "latent") per layer, or for the first
    `entry_layers[name]` layers (GLM-5's indexer keys). A pass of T tokens writes rows [length, length + T) and
    `advance(T)` commits them. Under a CUDA graph `static_positions` (a device tensor) says where new rows go and
    attention sees every row, masked by position.
    """

    def __init__(
        self,
        num_layers: int,
        capacity: int,
        token_shapes: dict[str, tuple[int, ...]],
        dtype: torch.dtype,
        device: torch.device,
        entry_layers: dict[str, int] | None = None,
    ):
        self.capacity = capacity
        self.length = 0
        self.device = device
        self.static_positions: torch.Tensor | None = None
        layers = {name: num_layers for name in token_shapes} | (entry_layers or {})
        self.buffers = {
            name: torch.zeros((layers[name], capacity, *shape), dtype=dtype, device=device)
            for name, shape in token_shapes.items()
        }

    def check_room(self, num_tokens: int) -> None:
        if self.length + num_tokens > self.capacity:
            raise UserError(
                f"the context is full ({self.capacity} tokens): start a new chat or load with a longer context"
            )

    def positions(self, num_tokens: int) -> torch.Tensor:
        if self.static_positions is not None:
            return self.static_positions
        return torch.arange(self.length, self.length + num_tokens, device=self.device)

    def num_rows(self, num_tokens: int) -> int:
        return self.capacity if self.static_positions is not None else self.length + num_tokens

    def layer_rows(self, layer: int, name: str) -> torch.Tensor:
        """[capacity, ...], for kernels that write the new rows at `positions` themselves."""
        return self.buffers[name][layer]

    def update(self, layer: int, name: str, values: torch.Tensor) -> torch.Tensor:
        """values [T, ...] -> rows [0, length + T) (all rows with static positions)."""
        buffer = self.buffers[name][layer]
        if self.static_positions is not None:
            buffer.index_copy_(0, self.static_positions, values)
            return buffer
        end = self.length + values.shape[0]
        buffer[self.length : end] = values
        return buffer[:end]

    def advance(self, num_tokens: int) -> None:
        self.length += num_tokens

    def truncate(self, length: int) -> None:
        assert 0 <= length <= self.length, f"cannot truncate a cache of {self.length} tokens to {length}"
        self.length = length

    @property
    def nbytes(self) -> int:
        return sum(b.numel() * b.element_size() for b in self.buffers.values())
