"""GLM's multi-token-prediction (MTP) layer, stored as checkpoint layer `num_hidden_layers` and ignored by
transformers, run as a drafter:

    x = eh_proj(cat[enorm(embed(next_token)), hnorm(prev_hidden)])      embedding first
    x = decoder_layer(x)                                                 attention + MoE, its own KV cache
    logits = shared_head.head(shared_head.norm(x))

`embed` and `shared_head.head` are the layer's own copies when the checkpoint has them (GLM-4.5,
GLM-4.7-Flash), the target's otherwise (GLM-5). Its routed experts live in the shared expert cache.
"""

import torch

from app.engine.layers.kv_cache import KVCache
from app.engine.layers.linear import linear
from app.kernels.norms import rms_norm


class GlmMtp:
    """`draft(hidden, next_tokens, cache)`: hidden [T, H] are final hidden states at positions p … p+T-1 (the
    target's, `forward(..., capture=(num_hidden_layers - 1,))`, or this drafter's own from its previous
    step) and next_tokens [T] the
    tokens at p+1 … p+T. It returns logits [T, V] (float32) for the tokens at p+2 … p+T+1 and its hidden
    states [T, H] (before shared_head.norm), which stand in for the target's in the next draft step.

    The cache is the drafter's own (`new_kv_cache`): row p holds the entry made from (hidden at p, token at
    p+1), and rope uses position p. Rewind it with `truncate(n)` like the target's cache.
    """

    def __init__(self, target, index: int, layer):
        c = target.config
        prefix = f"model.layers.{index}."
        self.target = target
        self.index = index
        self.layer = layer
        self.eps = c.rms_norm_eps
        vocab, hidden = c.vocab_size, c.hidden_size
        own = target.checkpoint.has
        self.embed = target.tensor(prefix + "embed_tokens.weight", (vocab, hidden)) \
            if own(prefix + "embed_tokens.weight") else target.embed
        self.head = target.weight(prefix + "shared_head.head", (vocab, hidden)) \
            if own(prefix + "shared_head.head.weight") else target.lm_head
        self.enorm = target.tensor(prefix + "enorm.weight", (hidden,), float32=True)
        self.hnorm = target.tensor(prefix + "hnorm.weight", (hidden,), float32=True)
        self.head_norm = target.tensor(prefix + "shared_head.norm.weight", (hidden,), float32=True)
        self.eh_proj = target.weight(prefix + "eh_proj", (hidden, 2 * hidden))

    def new_kv_cache(self, capacity: int) -> KVCache:
        return self.target.kv_cache(capacity, [self.index])

    def draft(
        self, hidden: torch.Tensor, next_tokens: torch.Tensor, cache: KVCache
    ) -> tuple[torch.Tensor, torch.Tensor]:
        step = self.target.attention_context(len(next_tokens), cache)
        embedded = rms_norm(self.embed[next_tokens], self.enorm, self.eps)
        normed_hidden = rms_norm(hidden.to(self.target.dtype), self.hnorm, self.eps)
        x = linear(torch.cat((embedded, normed_hidden), dim=-1), self.eh_proj)
        x = self.layer(x, step, cache)
        cache.advance(len(next_tokens))
        return linear(rms_norm(x, self.head_norm, self.eps), self.head).float(), x
