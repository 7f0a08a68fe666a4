"""The engine's model interface: a decoder of MoE layers over the shared expert cache, which everything that runs
a model (runner, segmented decode, scheduler, speculation) calls and nothing else.

A layer runs in two parts: `until_experts` (its input norm, which also adds the previous layer's routed experts,
attention, then whatever runs on every token beside the routed experts, and the router's choice: no host work, so
a CUDA graph can hold it) and the routed experts (`routed_experts`, which may need the host while experts are
offloaded). Adding a layer's routed experts in the next layer's norm lets an architecture fuse the two. The
passes (`forward`, `forward_batch`) and the look-ahead's guess from the embedding are built from those parts here,
once; an architecture gives the parts.
"""

import torch

from app.engine.experts.cache import ExpertCache
from app.engine.experts.store import Routing
from app.engine.layers.kv_cache import KVCache
from app.engine.layers.linear import linear
from app.kernels.norms import rms_norm


class MoeDecoder:
    """Subclasses set `config` (with num_hidden_layers, hidden_size, rms_norm_eps, vocab_size,
    num_experts_per_tok), `experts`, `device`, `dtype`, `embed`, `lm_head`, `final_norm`, `layers` (one entry per
    decoder layer) and `routing_override` (routing_override.py: benchmarks choose the experts instead of the
    router), and implement the methods that raise NotImplementedError."""

    experts: ExpertCache
    device: torch.device
    dtype: torch.dtype

    def new_kv_cache(self, capacity: int) -> KVCache:
        raise NotImplementedError

    def attention_context(self, num_tokens: int, cache: KVCache):
        """What every layer's attention reads for the `num_tokens` positions after the cache's committed ones."""
        raise NotImplementedError

    def input_norm(self, index: int, x: torch.Tensor,
                   expert_output: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor]:
        """Layer `index`'s input x [T, H] plus the previous layer's routed experts (None: nothing to add) -> (that
        sum, its norm for attention)."""
        raise NotImplementedError

    def attend(self, index: int, normed: torch.Tensor, context, cache: KVCache) -> torch.Tensor:
        """Layer `index`'s attention output [T, H] for its normed input [T, H] (one sequence, over its cache)."""
        raise NotImplementedError

    def until_routed(self, index: int, x: torch.Tensor, attended: torch.Tensor) -> tuple[torch.Tensor, Routing | None]:
        """The layer's input x [T, H] and attention output -> (the residual with attention and what runs beside
        the routed experts [T, H], their routing); a dense layer's routing is None and its first value is the
        layer's output."""
        raise NotImplementedError

    def routed_experts(self, index: int, routing: Routing) -> torch.Tensor:
        """The weighted sum [T, H] of the experts `routing` picked for layer `index`."""
        raise NotImplementedError

    def route_embedding(self, index: int, embedded: torch.Tensor) -> torch.Tensor:
        """The experts [T, k] MoE layer `index`'s router picks for token embeddings [T, H]."""
        raise NotImplementedError

    def load_mtp(self):
        """The architecture's multi-token-prediction layer as a drafter, None where it has none."""
        return None

    def until_experts(self, index: int, x: torch.Tensor, context, cache: KVCache,
                      expert_output: torch.Tensor | None = None) -> tuple[torch.Tensor, Routing | None]:
        """Layer `index` up to its routed experts: its input x [T, H] (plus `expert_output`, the previous layer's
        routed experts) -> (its output but the routed experts, their routing); segmented_decode.py captures this
        part."""
        x, normed = self.input_norm(index, x, expert_output)
        return self.until_routed(index, x, self.attend(index, normed, context, cache))

    def forward(
        self, token_ids: torch.Tensor, cache: KVCache, last_only: bool = False, capture: tuple[int, ...] = ()
    ) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
        """token_ids [T] following the cache's committed tokens -> logits [T, vocab] (float32), or
        [1, vocab] for the last position only (a prefill chunk needs no more).

        With `capture` (layer indices), returns (logits, features): transformers' `hidden_states[l + 1]`
        of those layers (the layer's output; for the last layer, after the final norm) concatenated in the
        order given, [T, len(capture) * H], for every position. That is the context a drafter reads.
        """
        cache.check_room(len(token_ids))
        context = self.attention_context(len(token_ids), cache)
        x, pending = self.embed[token_ids], None
        outputs = {}
        for index in range(len(self.layers)):
            x, routing = self.until_experts(index, x, context, cache, pending)
            pending = self._routed_or_none(index, routing)
            if index in capture:
                outputs[index] = _plus(x, pending)
        cache.advance(len(token_ids))
        return self.finish(_plus(x, pending), outputs, capture, last_only)

    def forward_batch(
        self, blocks: list[torch.Tensor], caches: list[KVCache], capture: tuple[int, ...] = ()
    ) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
        """Blocks of tokens [T_i] of N sequences, each after its cache's committed tokens -> logits [sum T_i,
        vocab] (float32), with `capture` also their features (see `forward`), in block order. Attention runs
        per sequence over its own cache; each layer's routed experts run once for all the tokens, so one
        expert sweep serves the whole batch."""
        contexts = []
        for block, cache in zip(blocks, caches, strict=True):
            cache.check_room(len(block))
            contexts.append(self.attention_context(len(block), cache))
        bounds = torch.tensor([0, *(len(block) for block in blocks)]).cumsum(0).tolist()
        rows = list(zip(bounds[:-1], bounds[1:], contexts, caches, strict=True))
        x, pending = self.embed[torch.cat(blocks)], None
        outputs = {}
        for index in range(len(self.layers)):
            x, normed = self.input_norm(index, x, pending)
            attended = torch.cat([self.attend(index, normed[start:end], context, cache)
                                  for start, end, context, cache in rows])
            x, routing = self.until_routed(index, x, attended)
            pending = self._routed_or_none(index, routing)
            if index in capture:
                outputs[index] = _plus(x, pending)
        for block, cache in zip(blocks, caches, strict=True):
            cache.advance(len(block))
        return self.finish(_plus(x, pending), outputs, capture, last_only=False)

    def embedding_routes(self, token_ids: torch.Tensor, layers: tuple[int, ...]) -> dict[int, torch.Tensor]:
        """Experts [T, k] that each of `layers` would pick for token_ids [T] if nothing but the token
        embedding reached it. A guess available before a forward pass starts, so the copies of a verify
        block's first layers can start early."""
        embedded = self.embed[token_ids]
        return {index: self.route_embedding(index, embedded) for index in layers}

    def finish(self, x: torch.Tensor, outputs: dict, capture: tuple[int, ...], last_only: bool):
        """The end of a pass: final norm, logits [T or 1, V] (float32), and with `capture` also the features
        [T, len(capture) * H] (the last layer's entry is taken after the final norm)."""
        last = self.config.num_hidden_layers - 1
        x = rms_norm(x, self.final_norm, self.config.rms_norm_eps)
        if last in capture:
            outputs[last] = x
        logits = linear(x[-1:] if last_only else x, self.lm_head).float()
        if not capture:
            return logits
        return logits, torch.cat([outputs[index] for index in capture], dim=-1)

    def _routed_or_none(self, index: int, routing: Routing | None) -> torch.Tensor | None:
        return None if routing is None else self.routed_experts(index, routing)


def _plus(x: torch.Tensor, expert_output: torch.Tensor | None) -> torch.Tensor:
    return x if expert_output is None else x + expert_output
