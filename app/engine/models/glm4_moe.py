"""GLM-4.5 / 4.6 / 4.7 and GLM-4.5-Air (`glm4_moe`): the GLM decoder with grouped-query attention whose
q/k/v have biases, optional per-head q/k RMSNorm and partial RoPE (the first `partial_rotary_factor` of
each head dim rotates by halves, the rest passes through)."""

from dataclasses import dataclass

import torch

from app.engine.layers.kv_cache import KVCache
from app.engine.layers.linear import linear, stacked_linear, stacked_rows
from app.engine.layers.ops import attend
from app.engine.models.glm import GlmConfig, GlmModel, Step
from app.kernels.choice import triton_runs
from app.kernels.decode_attention import decode_attention
from app.kernels.rotary_cache import rotary_cache_write_op


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
    """q, k and v in one product; their biases, the q/k norms, the rotation and the cache write in one kernel
    (rotary_cache.py); one query over the cache in the decode attention kernel where Triton runs."""

    def __init__(self, model: "Glm4Moe", index: int, cache_layer: int):
        c = model.config
        prefix = f"model.layers.{index}.self_attn."
        heads, kv_heads, head_dim, hidden = (
            c.num_attention_heads, c.num_key_value_heads, c.attention_head_dim, c.hidden_size
        )
        self.cache_layer = cache_layer
        self.heads = (heads + 2 * kv_heads, head_dim)
        self.eps = c.rms_norm_eps
        self.scale = head_dim**-0.5
        sizes = {"q_proj": heads * head_dim, "k_proj": kv_heads * head_dim, "v_proj": kv_heads * head_dim}
        projections = [model.weight(prefix + name, (out, hidden)) for name, out in sizes.items()]
        self.qkv = stacked_rows(projections)
        self.projections = projections if self.qkv is None else None  # block scales that do not stack
        self.qkv_bias = torch.cat([
            model.tensor(prefix + name + ".bias", (out,)) for name, out in sizes.items()
        ]) if c.attention_bias else None
        self.head_norms = torch.stack([
            model.tensor(prefix + name, (head_dim,), float32=True) for name in ("q_norm.weight", "k_norm.weight")
        ]) if c.use_qk_norm else None
        self.o = model.weight(prefix + "o_proj", (hidden, heads * head_dim))
        self.rotary_write = rotary_cache_write_op(model.device)
        self.decode_attention = decode_attention if triton_runs(model.device) else None

    def __call__(self, x: torch.Tensor, step: Step, cache: KVCache) -> torch.Tensor:
        qkv = stacked_linear(x, self.qkv, self.projections)
        keys, values = cache.layer_rows(self.cache_layer, "k"), cache.layer_rows(self.cache_layer, "v")
        q = self.rotary_write(qkv.unflatten(-1, self.heads), step.cos, step.sin, step.positions, keys, values,
                              self.qkv_bias, self.head_norms, self.eps)
        if len(x) == 1 and self.decode_attention is not None:
            out = self.decode_attention(q, keys, values, step.positions, self.scale, None, None)
        else:
            rows = cache.num_rows(len(x))
            out = attend(q, keys[:rows], values[:rows], step.visible, self.scale)
        return linear(out.flatten(-2), self.o)


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
