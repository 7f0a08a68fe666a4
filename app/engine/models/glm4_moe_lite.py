"""GLM-4.7-Flash (`glm4_moe_lite`): the GLM decoder with multi-head latent attention (mla.py) and a
compressed-latent KV cache. GLM-5 (glm_moe_dsa.py) adds DSA on top of this model."""

from app.engine.layers.kv_cache import KVCache
from app.engine.models.glm import GlmModel
from app.engine.models.mla import LatentAttention, MlaConfig, latent_shape


class Glm4MoeLite(GlmModel):
    config: MlaConfig

    @property
    def rotary_dim(self) -> int:
        return self.config.qk_rope_head_dim

    def attention(self, index: int, cache_layer: int) -> LatentAttention:
        return LatentAttention(self, index, cache_layer)

    def kv_cache(self, capacity: int, layers: list[int]) -> KVCache:
        return KVCache(len(layers), capacity, {"latent": latent_shape(self.config)}, self.dtype, self.device)
