"""GLM-5 (`glm_moe_dsa`): GLM-4.7-Flash's MLA decoder with DeepSeek Sparse Attention (DSA). A lightning
indexer scores every cached token for each query and attention reads only the top `index_topk`; layers
marked "shared" in `indexer_types` reuse the selection of the last layer that ran its indexer. The MTP
layer runs its own indexer."""

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from app.engine.layers.kv_cache import KVCache
from app.engine.layers.linear import linear
from app.engine.models.glm import Step
from app.engine.models.glm4_moe_lite import Glm4MoeLite
from app.engine.models.mla import LatentAttention, MlaConfig, latent_shape
from app.kernels.rotary_cache import rotate_pairs
from app.plan import dsa_indexer_types

INDEX_KEY_NORM_EPS = 1e-6


@dataclass(frozen=True)
class DsaConfig(MlaConfig):
    index_topk: int = 2048
    index_head_dim: int = 128
    index_n_heads: int = 32
    indexer_types: tuple[str, ...] = ()

    @classmethod
    def from_dict(cls, config: dict) -> "DsaConfig":
        return super().from_dict({**config, "indexer_types": list(dsa_indexer_types(config))})

    def runs_indexer(self, index: int) -> bool:
        return index >= self.num_hidden_layers or self.indexer_types[index] == "full"


class Indexer:
    """Per query, the `index_topk` earlier tokens with the highest index score
    sum_h w_h(x) · relu(q_h · k) / sqrt(d), where q comes from the query latent and one key k per token
    (LayerNorm, interleaved rope on its first rope dims) is cached as "index_key"."""

    def __init__(self, model: "GlmMoeDsa", index: int, cache_slot: int):
        c = model.config
        prefix = f"model.layers.{index}.self_attn.indexer."
        self.cache_slot = cache_slot
        self.heads, self.dim, self.rope, self.topk = c.index_n_heads, c.index_head_dim, c.qk_rope_head_dim, c.index_topk
        self.wq_b = model.weight(prefix + "wq_b", (self.heads * self.dim, c.q_lora_rank))
        self.wk = model.weight(prefix + "wk", (self.dim, c.hidden_size))
        self.k_norm = model.tensor(prefix + "k_norm.weight", (self.dim,))
        self.k_norm_bias = model.tensor(prefix + "k_norm.bias", (self.dim,))
        self.weights_proj = model.weight(prefix + "weights_proj", (self.heads, c.hidden_size), float32=True)

    def __call__(self, x: torch.Tensor, query_latent: torch.Tensor, step: Step, cache: KVCache) -> torch.Tensor:
        """-> the selected keys [T, L] (bool)."""
        q = linear(query_latent, self.wq_b).unflatten(-1, (self.heads, self.dim))
        k = F.layer_norm(linear(x, self.wk), (self.dim,), self.k_norm, self.k_norm_bias, INDEX_KEY_NORM_EPS)
        q = torch.cat((rotate_pairs(q[..., : self.rope], step.cos, step.sin), q[..., self.rope :]), dim=-1)
        k = torch.cat((rotate_pairs(k[:, None, : self.rope], step.cos, step.sin)[:, 0], k[:, self.rope :]), dim=-1)
        keys = cache.update(self.cache_slot, "index_key", k)  # [L, d]
        scores = torch.relu(torch.matmul(q.float(), keys.float().T) * self.dim**-0.5)  # [T, heads, L]
        head_weights = (x.float() @ self.weights_proj.T) * self.heads**-0.5  # [T, heads]
        index_scores = torch.matmul(head_weights[:, None, :], scores)[:, 0].masked_fill(~step.visible, float("-inf"))
        chosen = index_scores.topk(min(self.topk, index_scores.shape[-1]), dim=-1).indices
        return torch.zeros_like(step.visible).scatter_(-1, chosen, True)


class SparseLatentAttention(LatentAttention):
    def __init__(self, model: "GlmMoeDsa", index: int, cache_layer: int, index_slot: int | None):
        super().__init__(model, index, cache_layer)
        self.indexer = None if index_slot is None else Indexer(model, index, index_slot)
        self.decode_attention = None  # a query sees the rows its indexer keeps, not every earlier one

    def visible(self, x: torch.Tensor, query_latent: torch.Tensor, step: Step, cache: KVCache) -> torch.Tensor:
        if self.indexer is not None:
            step.selected = self.indexer(x, query_latent, step, cache)
        assert step.selected is not None, "a shared DSA layer needs an earlier layer that runs its indexer"
        return step.visible & step.selected


class GlmMoeDsa(Glm4MoeLite):
    config: DsaConfig

    def attention(self, index: int, cache_layer: int) -> SparseLatentAttention:
        # index keys are kept only for layers that run the indexer: the slot counts those before this one
        # (the target's cache layers are its checkpoint layers; the MTP's cache has one layer)
        runs = self.config.runs_indexer
        slot = sum(map(runs, range(cache_layer))) if runs(index) else None
        return SparseLatentAttention(self, index, cache_layer, slot)

    def kv_cache(self, capacity: int, layers: list[int]) -> KVCache:
        c = self.config
        shapes = {"latent": latent_shape(c), "index_key": (c.index_head_dim,)}
        indexed = {"index_key": sum(map(c.runs_indexer, layers))}
        return KVCache(len(layers), capacity, shapes, self.dtype, self.device, indexed)
