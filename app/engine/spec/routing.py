"""Route-ahead prefetch for a verify pass.

The block is known before its pass starts, so the copies of the experts its first MoE layers will need
can start then: those layers' routers applied to the block's token embeddings guess them. Later layers
are predicted inside the pass, several layers ahead, by their routers applied to the hidden states
of the layer that runs (`ExpertCache.lookahead_layers`). Every prediction is recorded when it is made,
before the layer it predicts runs, so the cache scores coverage and waste honestly.
"""

import torch


def prefetch_for_block(model, block: list[int]) -> None:
    """Start the copies for the first MoE layers of a pass over `block` (token ids)."""
    experts = model.experts
    layers = experts.lookahead_layers(None, len(block))
    if not layers:
        return
    routes = model.embedding_routes(torch.tensor(block, device=model.device), layers)
    wanted = torch.cat([routes[layer].flatten() for layer in layers]).tolist()  # one host synchronisation
    per_layer = len(wanted) // len(layers)
    for i, layer in enumerate(layers):
        experts.prefetch(layer, sorted(set(wanted[i * per_layer : (i + 1) * per_layer])))
