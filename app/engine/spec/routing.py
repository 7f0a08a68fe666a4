"""Route-ahead prefetch for a verify pass: the block is known before the pass, so its first MoE layers' routers on
the token embeddings guess their experts and the copies start early (later layers are predicted in the pass).
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
