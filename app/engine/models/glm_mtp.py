"""GLM's multi-token-prediction layer (checkpoint layer `num_hidden_layers`, ignored by transformers) as a drafter:

    x = eh_proj(cat[enorm(embed(next_token)), hnorm(prev_hidden)])      embedding first
    x = decoder_layer(x)                                                 attention + MoE, its own KV cache
    logits = shared_head.head(shared_head.norm(x))

`embed` and `shared_head.head` are the layer's own where the checkpoint has them, else the target's (GLM-5).
"""

import torch

from app.engine.layers.kv_cache import KVCache
from app.engine.layers.linear import linear


class GlmMtp:
    """`draft(hidden, next_tokens, cache)`: final hidden states [T, H] at p … p+T-1 (the target's or its own
    previous ones) and next_tokens [T] at p+1 … p+T -> float32 logits [T, V] for p+2 … p+T+1 and its hidden
    states [T, H] before shared_head.norm. Cache row p (rope position p) is made from (hidden p, token p+1)."""

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
        embedded = self._norm(self.embed[next_tokens], self.enorm)
        normed_hidden = self._norm(hidden.to(self.target.dtype), self.hnorm)
        x = linear(torch.cat((embedded, normed_hidden), dim=-1), self.eh_proj)
        x = self.layer(x, step, cache)
        cache.advance(len(next_tokens))
        return linear(self._norm(x, self.head_norm), self.head).float(), x

    def _norm(self, x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
        return self.target.norm_alone(x, weight, self.eps)
