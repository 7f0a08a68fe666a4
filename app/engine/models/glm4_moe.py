"""GLM-4.5 / 4.6 / 4.7 and GLM-4.5-Air (`glm4_moe`): the GLM decoder with grouped-query attention whose
q/k/v have biases, optional per-head q/k RMSNorm and partial RoPE (the first `partial_rotary_factor` of
each head dim rotates by halves, the rest passes through)."""

from dataclasses import dataclass

import torch

from app.engine.layers.kv_cache import KVCache
from app.engine.layers.linear import Fp8Weight, linear
from app.engine.layers.ops import attend
from app.engine.models.glm import GlmConfig, GlmModel, Step
from app.kernels.norms import rms_norm
from app.kernels.rotary_cache import rotate_halves


@dataclass(frozen=True)
class Glm4MoeConfig(GlmConfig):
    num_key_value_heads: int = 8
    head_dim: int | None = None
    attention_bias: bool = False
    use_qk_norm: bool = False
    partial_rotary_factor: float = 0.5

    @property
    def attention_head_dim(self) -> int:
        return self.head_dim or self.hidden_size // self.num_attention_heads

    @property
    def rotary_dim(self) -> int:
        factor = (self.rope_parameters or {}).get("partial_rotary_factor", self.partial_rotary_factor)
        return int(self.attention_head_dim * factor)


class GroupedQueryAttention:
    def __init__(self, model: "Glm4Moe", index: int, cache_layer: int):
        c = model.config
        prefix = f"model.layers.{index}.self_attn."
        heads, kv_heads, head_dim, hidden = (
            c.num_attention_heads, c.num_key_value_heads, c.attention_head_dim, c.hidden_size
        )
        self.cache_layer = cache_layer
        self.shape, self.kv_shape = (heads, head_dim), (kv_heads, head_dim)
        self.eps = c.rms_norm_eps
        self.scale = head_dim**-0.5

        def projection(name: str, out: int) -> tuple[torch.Tensor | Fp8Weight, torch.Tensor | None]:
            bias = model.tensor(prefix + name + ".bias", (out,)) if c.attention_bias else None
            return model.weight(prefix + name, (out, hidden)), bias

        def norm(name: str) -> torch.Tensor | None:
            return model.tensor(prefix + name, (head_dim,), float32=True) if c.use_qk_norm else None

        self.q, self.q_bias = projection("q_proj", heads * head_dim)
        self.k, self.k_bias = projection("k_proj", kv_heads * head_dim)
        self.v, self.v_bias = projection("v_proj", kv_heads * head_dim)
        self.o = model.weight(prefix + "o_proj", (hidden, heads * head_dim))
        self.q_norm, self.k_norm = norm("q_norm.weight"), norm("k_norm.weight")

    def __call__(self, x: torch.Tensor, step: Step, cache: KVCache) -> torch.Tensor:
        q = linear(x, self.q, self.q_bias).unflatten(-1, self.shape)
        k = linear(x, self.k, self.k_bias).unflatten(-1, self.kv_shape)
        v = linear(x, self.v, self.v_bias).unflatten(-1, self.kv_shape)
        if self.q_norm is not None:
            q, k = rms_norm(q, self.q_norm, self.eps), rms_norm(k, self.k_norm, self.eps)
        q, k = rotate_halves(q, step.cos, step.sin), rotate_halves(k, step.cos, step.sin)
        keys, values = cache.update(self.cache_layer, "k", k), cache.update(self.cache_layer, "v", v)
        return linear(attend(q, keys, values, step.visible, self.scale).flatten(-2), self.o)


class Glm4Moe(GlmModel):
    config: Glm4MoeConfig

    @property
    def rotary_dim(self) -> int:
        return self.config.rotary_dim

    def attention(self, index: int, cache_layer: int) -> GroupedQueryAttention:
        return GroupedQueryAttention(self, index, cache_layer)

    def kv_cache(self, capacity: int, layers: list[int]) -> KVCache:
        shape = (self.config.num_key_value_heads, self.config.attention_head_dim)
        return KVCache(len(layers), capacity, {"k": shape, "v": shape}, self.dtype, self.device)
