"""An expert op for a single token as a CUDA graph: Triton launches cost tens of µs on the host, and with experts
offloaded the step cannot be one graph, but the op can.
"""

import torch

from app.engine.layers.graph_capture import warm_up


class SingleTokenGraph:
    """hidden [1, H], slots/weights [1, k]; the next call overwrites the result."""

    def __init__(self, op, arenas: dict[str, torch.Tensor], hidden: torch.Tensor, slots: torch.Tensor,
                 weights: torch.Tensor):
        self.hidden, self.slots, self.weights = hidden.clone(), slots.clone(), weights.clone()
        warm_up(lambda: op(self.hidden, arenas, self.slots, self.weights), hidden.device)
        self.graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(self.graph):
            self.out = op(self.hidden, arenas, self.slots, self.weights)

    def __call__(self, hidden: torch.Tensor, slots: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
        self.hidden.copy_(hidden)
        self.slots.copy_(slots)
        self.weights.copy_(weights)
        self.graph.replay()
        return self.out
