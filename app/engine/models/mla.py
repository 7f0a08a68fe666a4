"""Multi-head latent attention (MLA, DeepSeek-V3 style), shared by GLM-4.7-Flash and GLM-5.

The cache row per token is "latent" [kv_lora_rank + qk_rope_head_dim]: normed KV latent, then the shared rotated
rope key. Full keys and values are never built: kv_b_proj's key half moves queries into latent space, attention
runs as one latent "head", its value half maps back per head. Shapes come from the lora/nope/rope/v fields, not
`head_dim` (GLM-5.2: head_dim 192 with a 64-dim rope).
"""

from dataclasses import dataclass

import torch

from app.engine.layers.kv_cache import KVCache
from app.engine.layers.linear import linear
from app.engine.layers.ops import attend
from app.engine.layers.rope import rotate_pairs
from app.engine.models.glm import GlmConfig, GlmModel, Step
from app.kernels.choice import triton_runs
from app.kernels.decode_attention import decode_attention
from app.kernels.norms import rms_norm
from app.kernels.rotary_cache import rotate_halves

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
        self.splits = (nope, rope)
        self.latent_rank = latent
        self.scale = (nope + rope) ** -0.5
        self.rotate = rotate_pairs if c.rope_interleave else rotate_halves
        self.q_a = model.weight(prefix + "q_a_proj", (c.q_lora_rank, hidden))
        self.q_a_norm = model.tensor(prefix + "q_a_layernorm.weight", (c.q_lora_rank,), float32=True)
        self.q_b = model.weight(prefix + "q_b_proj", (heads * (nope + rope), c.q_lora_rank))
        self.kv_a = model.weight(prefix + "kv_a_proj_with_mqa", (latent + rope, hidden))
        self.kv_a_norm = model.tensor(prefix + "kv_a_layernorm.weight", (latent,), float32=True)
        # used per head (absorbed into the queries and the output), not as x @ W.T: dequantized at load
        kv_b = model.weight(prefix + "kv_b_proj", (heads * (nope + c.v_head_dim), latent), dequantized=True)
        kv_b = kv_b.unflatten(0, (heads, -1))
        self.key_up, self.value_up = kv_b[:, :nope], kv_b[:, nope:]  # [heads, nope, latent], [heads, v, latent]
        self.o = model.weight(prefix + "o_proj", (hidden, heads * c.v_head_dim))
        # one query over every earlier row (DSA's queries see only the rows its indexer keeps)
        self.decode_attention = decode_attention if triton_runs(model.device) else None

    def query_latent(self, x: torch.Tensor) -> torch.Tensor:
        """x [T, H] -> the normalised query latent [T, q_lora_rank] (DSA's indexer reads it too)."""
        return rms_norm(linear(x, self.q_a), self.q_a_norm, LATENT_NORM_EPS)

    def visible(self, x: torch.Tensor, query_latent: torch.Tensor, step: Step, cache: KVCache) -> torch.Tensor:
        """-> [T, L]: all earlier tokens (DSA narrows this down)."""
        return step.visible

    def __call__(self, x: torch.Tensor, step: Step, cache: KVCache) -> torch.Tensor:
        query_latent = self.query_latent(x)
        q_nope, q_rope = linear(query_latent, self.q_b).unflatten(-1, (self.key_up.shape[0], -1)).split(self.splits, -1)
        kv_latent, k_rope = linear(x, self.kv_a).split((self.latent_rank, self.splits[1]), dim=-1)
        k_rope = self.rotate(k_rope[:, None], step.cos, step.sin)[:, 0]
        entry = torch.cat((rms_norm(kv_latent, self.kv_a_norm, LATENT_NORM_EPS), k_rope), dim=-1)  # latent_shape
        latents = cache.update(self.cache_layer, "latent", entry)[:, None]  # [L, 1, latent + rope]
        queries = torch.cat((
            torch.einsum("thn,hnc->thc", q_nope, self.key_up),
            self.rotate(q_rope, step.cos, step.sin),
        ), dim=-1)  # [T, heads, latent + rope]
        if len(x) == 1 and self.decode_attention is not None:  # reads the rows up to the query's position
            out = self.decode_attention(queries, latents, latents[..., : self.latent_rank], step.positions, self.scale,
                                        None, None)  # [1, heads, latent]
        else:
            visible = self.visible(x, query_latent, step, cache)
            out = attend(queries, latents, latents[..., : self.latent_rank], visible, self.scale)  # [T, heads, latent]
        return linear(torch.einsum("thc,hvc->thv", out, self.value_up).flatten(-2), self.o)


def latent_shape(config: MlaConfig) -> tuple[int]:
    return (config.kv_lora_rank + config.qk_rope_head_dim,)
