"""Multi-head latent attention (MLA, DeepSeek-V3 style), shared by GLM-4.7-Flash and GLM-5.

The cache row per token is "latent" [kv_lora_rank + qk_rope_head_dim]: normed KV latent, then the shared rotated
rope key. Full keys and values are never built: kv_b_proj's key half moves queries into latent space, attention
runs as one latent "head", its value half maps back per head. Shapes come from the lora/nope/rope/v fields, not
`head_dim` (GLM-5.2: head_dim 192 with a 64-dim rope).

A pass's launches: q_a and kv_a as one product; the latents' norms, the key's rotation and the cache write as one
kernel (latent_cache.py); q_b; the queries into latent space with their rope dims rotated, and the attention's
output back out of it, as one kernel each (head_products.py); attention; o_proj.
"""

from dataclasses import dataclass

import torch

from app.engine.layers.kv_cache import KVCache
from app.engine.layers.linear import linear, stacked_linear, stacked_rows
from app.engine.layers.ops import attend
from app.engine.models.glm import GlmConfig, GlmModel, Step
from app.kernels.choice import triton_runs
from app.kernels.decode_attention import decode_attention
from app.kernels.head_products import head_products_op
from app.kernels.latent_cache import latent_cache_write_op

LATENT_NORM_EPS = 1e-6  # q_a_layernorm and kv_a_layernorm use the RMSNorm default, not rms_norm_eps


@dataclass(frozen=True)
class MlaConfig(GlmConfig):
    q_lora_rank: int = 768
    kv_lora_rank: int = 512
    qk_nope_head_dim: int = 192
    qk_rope_head_dim: int = 64
    v_head_dim: int = 256
    rope_interleave: bool = True


class LatentAttention:
    def __init__(self, model: GlmModel, index: int, cache_layer: int):
        c: MlaConfig = model.config
        prefix = f"model.layers.{index}.self_attn."
        heads, hidden = c.num_attention_heads, c.hidden_size
        nope, rope, latent = c.qk_nope_head_dim, c.qk_rope_head_dim, c.kv_lora_rank
        self.cache_layer = cache_layer
        self.heads = heads
        self.latent_rank = latent
        self.scale = (nope + rope) ** -0.5
        self.interleaved = c.rope_interleave
        q_a = model.weight(prefix + "q_a_proj", (c.q_lora_rank, hidden))
        kv_a = model.weight(prefix + "kv_a_proj_with_mqa", (latent + rope, hidden))
        # both down-projections in one product where they stack (block scales that straddle the two do not)
        self.latent_in = stacked_rows([q_a, kv_a])
        self.latent_in_parts = (q_a, kv_a) if self.latent_in is None else None
        self.q_a_norm = model.tensor(prefix + "q_a_layernorm.weight", (c.q_lora_rank,), float32=True)
        self.kv_a_norm = model.tensor(prefix + "kv_a_layernorm.weight", (latent,), float32=True)
        self.q_b = model.weight(prefix + "q_b_proj", (heads * (nope + rope), c.q_lora_rank))
        # used per head (absorbed into the queries and the output), not as x @ W.T: dequantized at load
        kv_b = model.weight(prefix + "kv_b_proj", (heads * (nope + c.v_head_dim), latent), dequantized=True)
        kv_b = kv_b.unflatten(0, (heads, -1))
        self.key_up = kv_b[:, :nope].transpose(1, 2).contiguous()  # [heads, latent, nope]: rows for the queries
        self.value_up = kv_b[:, nope:].contiguous()  # [heads, v, latent]
        self.o = model.weight(prefix + "o_proj", (hidden, heads * c.v_head_dim))
        self.write_latent = latent_cache_write_op(model.device)
        self.head_products = head_products_op(model.device)
        # one query over every earlier row (DSA's queries see only the rows its indexer keeps)
        self.decode_attention = decode_attention if triton_runs(model.device) else None

    def latent_inputs(self, x: torch.Tensor) -> torch.Tensor:
        """x [T, H] -> [T, q_lora_rank + kv_lora_rank + rope]: the query latent, the KV latent and the rope key."""
        return stacked_linear(x, self.latent_in, self.latent_in_parts)

    def visible(self, x: torch.Tensor, query_latent: torch.Tensor, step: Step, cache: KVCache) -> torch.Tensor:
        """-> [T, L]: all earlier tokens (DSA narrows this down)."""
        return step.visible

    def __call__(self, x: torch.Tensor, step: Step, cache: KVCache) -> torch.Tensor:
        latents = cache.layer_rows(self.cache_layer, "latent")  # [C, latent + rope]
        query_latent = self.write_latent(self.latent_inputs(x), self.q_a_norm, self.kv_a_norm, LATENT_NORM_EPS,
                                         step.cos, step.sin, step.positions, latents, self.interleaved)
        q = linear(query_latent, self.q_b).unflatten(-1, (self.heads, -1))  # [T, heads, nope + rope]
        queries = self.head_products(q, self.key_up, step.cos, step.sin, self.interleaved)  # [T, heads, latent + rope]
        rows = latents[: cache.num_rows(len(x))][:, None]  # [L, 1, latent + rope]
        if len(x) == 1 and self.decode_attention is not None:  # reads the rows up to the query's position
            out = self.decode_attention(queries, rows, rows[..., : self.latent_rank], step.positions, self.scale,
                                        None, None)  # [1, heads, latent]
        else:
            visible = self.visible(x, query_latent, step, cache)
            out = attend(queries, rows, rows[..., : self.latent_rank], visible, self.scale)  # [T, heads, latent]
        return linear(self.head_products(out, self.value_up).flatten(-2), self.o)


def latent_shape(config: MlaConfig) -> tuple[int]:
    return (config.kv_lora_rank + config.qk_rope_head_dim,)
