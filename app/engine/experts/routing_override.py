"""Experts chosen outside the router, for benchmarks (`bench/decode_*.py --routing trace|uniform`): random weights
do not route like a trained model, and routing decides everything a cache does. The router's scores still weight
the chosen experts and look-ahead still comes from the router. Device work only: a CUDA graph holds it.
"""

import numpy as np
import torch


class ReplayedRouting:
    """trace [N, L, k] experts of the model's L MoE layers (`layers`, in order) for N tokens: a pass of T tokens
    takes the next T rows, wrapping around at the end."""

    def __init__(self, trace: np.ndarray, layers: tuple[int, ...], device: torch.device):
        assert trace.shape[1] == len(layers), f"a trace of {trace.shape[1]} layers for a model of {len(layers)}"
        self.trace = torch.from_numpy(trace.astype(np.int64)).to(device)  # [N, L, k]
        self.column = {layer: index for index, layer in enumerate(layers)}
        self.first_layer = layers[0]
        self.next_row = torch.zeros((), dtype=torch.long, device=device)
        self.rows = torch.zeros(0, dtype=torch.long, device=device)

    def experts(self, layer: int, num_tokens: int) -> torch.Tensor:
        """-> [T, k]; the first MoE layer starts a pass."""
        if layer == self.first_layer:
            self.rows = (self.next_row + torch.arange(num_tokens, device=self.trace.device)) % len(self.trace)
            self.next_row.add_(num_tokens)
        return self.trace[self.rows, self.column[layer]]


class UniformRouting:
    """k distinct experts per token, uniformly (the worst case for a cache; torch's default generator)."""

    def __init__(self, num_experts: int, top_k: int, device: torch.device):
        self.num_experts, self.top_k, self.device = num_experts, top_k, device

    def experts(self, layer: int, num_tokens: int) -> torch.Tensor:
        draws = torch.rand(num_tokens, self.num_experts, device=self.device)
        return draws.topk(self.top_k, dim=-1).indices
