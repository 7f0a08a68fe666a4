"""The engine's model interface: everything that runs a model calls only this.

A layer runs in two parts: `until_experts` (norm, attention, what runs beside the routed experts, the router; no
host work, so a CUDA graph can hold it) and `routed_experts` (may need the host while experts are offloaded). A
layer's routed experts are added in the next layer's input norm so an architecture can fuse the two. Architectures
give the parts; the passes are built from them here, once.
"""

import torch

from app.engine.experts.cache import ExpertCache
from app.engine.experts.store import Routing
from app.engine.layers.kv_cache import KVCache
from app.engine.layers.linear import linear
from app.kernels.pick_rows import PickRows


class MoeDecoder:
    """Subclasses set `config`, `experts`, `device`, `dtype`, `embed`, `lm_head`, `final_norm`, `layers`,
    `routing_override` and `add_norm` (norms.add_rms_norm_op's), and implement the methods that raise
    NotImplementedError."""

    experts: ExpertCache
    device: torch.device
    dtype: torch.dtype

    def new_kv_cache(self, capacity: int) -> KVCache:
        raise NotImplementedError

    def attention_context(self, num_tokens: int, cache: KVCache):
        raise NotImplementedError

    def input_norm(self, index: int, x: torch.Tensor,
                   expert_output: torch.Tensor | PickRows | None) -> tuple[torch.Tensor, torch.Tensor]:
        """x [T, H] plus the previous layer's routed experts (None: nothing to add; PickRows: their picks before
        the sum, pick_rows.py) -> (that sum, its norm)."""
        raise NotImplementedError

    def attend(self, index: int, normed: torch.Tensor, context, cache: KVCache) -> torch.Tensor:
        """normed [T, H] of one sequence -> attention output [T, H] over its cache."""
        raise NotImplementedError

    def until_routed(self, index: int, x: torch.Tensor, attended: torch.Tensor) -> tuple[torch.Tensor, Routing | None]:
        """-> (residual plus attention and what runs beside the routed experts [T, H], routing); a dense layer's
        routing is None."""
        raise NotImplementedError

    def routed_experts(self, index: int, routing: Routing) -> torch.Tensor | PickRows:
        raise NotImplementedError

    def route_embedding(self, index: int, embedded: torch.Tensor) -> torch.Tensor:
        """embedded [T, H] -> the experts [T, k] the router picks."""
        raise NotImplementedError

    def load_mtp(self):
        return None

    def until_experts(self, index: int, x: torch.Tensor, context, cache: KVCache,
                      expert_output: torch.Tensor | PickRows | None = None, outputs: dict | None = None,
                      capture: tuple[int, ...] = ()) -> tuple[torch.Tensor, Routing | None]:
        """With `capture`, the layer before's output into `outputs` if it is listed (`_keep_output`)."""
        x, normed = self.input_norm(index, x, expert_output)
        _keep_output(outputs, capture, index - 1, x)
        return self.until_routed(index, x, self.attend(index, normed, context, cache))

    def forward(
        self, token_ids: torch.Tensor, cache: KVCache, last_only: bool = False, capture: tuple[int, ...] = ()
    ) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
        """token_ids [T] after the cache's committed tokens -> float32 logits [T, V] ([1, V] with `last_only`).

        With `capture` (layer indices) also the drafter's features [T, len(capture) * H]: transformers'
        `hidden_states[l + 1]` of those layers in the order given (the last layer's after the final norm).
        """
        cache.check_room(len(token_ids))
        context = self.attention_context(len(token_ids), cache)
        x, pending = self.embed[token_ids], None
        outputs = {}
        for index in range(len(self.layers)):
            x, routing = self.until_experts(index, x, context, cache, pending, outputs, capture)
            pending = self._routed_or_none(index, routing)
        cache.advance(len(token_ids))
        return self.finish(x, pending, outputs, capture, last_only)

    def forward_batch(
        self, blocks: list[torch.Tensor], caches: list[KVCache], capture: tuple[int, ...] = ()
    ) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
        """blocks [T_i] of N sequences -> `forward`'s outputs over [sum T_i] in block order. Attention runs per
        sequence; routed experts once for all tokens, so one expert sweep serves the batch."""
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
            _keep_output(outputs, capture, index - 1, x)
            attended = torch.cat([self.attend(index, normed[start:end], context, cache)
                                  for start, end, context, cache in rows])
            x, routing = self.until_routed(index, x, attended)
            pending = self._routed_or_none(index, routing)
        for block, cache in zip(blocks, caches, strict=True):
            cache.advance(len(block))
        return self.finish(x, pending, outputs, capture, last_only=False)

    def embedding_routes(self, token_ids: torch.Tensor, layers: tuple[int, ...]) -> dict[int, torch.Tensor]:
        """Experts [T, k] each of `layers` would pick from the embedding alone: a guess before the pass starts,
        so a verify block's first copies start early."""
        embedded = self.embed[token_ids]
        return {index: self.route_embedding(index, embedded) for index in layers}

    def finish(self, x: torch.Tensor, expert_output: torch.Tensor | PickRows | None, outputs: dict,
               capture: tuple[int, ...], last_only: bool):
        """x [T, H] plus the last layer's routed experts (None: nothing to add) -> `forward`'s outputs."""
        last = self.config.num_hidden_layers - 1
        x = self.add_norm(x, expert_output, self.final_norm, self.config.rms_norm_eps)[1]
        if last in capture:
            outputs[last] = x
        logits = linear(x[-1:] if last_only else x, self.lm_head).float()
        if not capture:
            return logits
        return logits, torch.cat([outputs[index] for index in capture], dim=-1)

    def norm_alone(self, x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
        """RMSNorm over x's last dimension ([..., D], weight [D]) in `add_norm` with nothing to add: one launch where
        its kernel runs (the drafters' norms, per head too)."""
        return self.add_norm(x.reshape(-1, x.shape[-1]), None, weight, eps)[1].view(x.shape)

    def _routed_or_none(self, index: int, routing: Routing | None) -> torch.Tensor | PickRows | None:
        return None if routing is None else self.routed_experts(index, routing)


def _keep_output(outputs: dict | None, capture: tuple[int, ...], index: int, x: torch.Tensor) -> None:
    """Layer `index`'s output x [T, H] into `outputs` if it is captured; x as the next layer's input norm returns it,
    the layer's routed experts added there (adding them again for the capture cost two launches a captured layer)."""
    if index in capture:
        outputs[index] = x
