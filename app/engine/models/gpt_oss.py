"""GPT-OSS: attention with sinks and alternating sliding windows, YaRN RoPE, top-k softmax router,
clamped SwiGLU experts (gate/up interleaved) that live in the expert cache."""

from dataclasses import dataclass
from typing import NamedTuple

import torch

from app.engine.experts.cache import ExpertCache
from app.engine.experts.store import ExpertTensors, Routing
from app.engine.layers.kv_cache import KVCache
from app.engine.layers.linear import linear
from app.engine.layers.ops import attend, causal_mask
from app.engine.layers.rope import Rotary
from app.engine.models.moe_decoder import MoeDecoder
from app.engine.weights.checkpoint import Checkpoint
from app.kernels.choice import triton_runs
from app.kernels.decode_attention import decode_attention, takes_queries
from app.kernels.gpt_oss_experts import gpt_oss_expert_op
from app.kernels.norms import add_rms_norm_half_pairs, add_rms_norm_op, rms_norm
from app.kernels.pick_rows import PickRows
from app.kernels.rotary_cache import rotary_cache_write_op
from app.kernels.router import top_k_router_op, top_k_router_slots_op


class AttentionContext(NamedTuple):
    """A pass's positions [T], masks per window (None: full attention) [T, L] (none for a token or a verify block
    where the decode attention kernel runs), cos and sin [T, head_dim / 2] of its positions."""

    positions: torch.Tensor
    masks: dict[int | None, torch.Tensor]
    cos: torch.Tensor
    sin: torch.Tensor


@dataclass(frozen=True)
class GptOssConfig:
    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    num_local_experts: int
    num_experts_per_tok: int
    vocab_size: int
    rms_norm_eps: float
    sliding_window: int
    layer_types: tuple[str, ...]
    rope_theta: float
    rope_scaling: dict | None
    swiglu_limit: float
    swiglu_alpha: float
    tie_word_embeddings: bool

    @classmethod
    def from_dict(cls, config: dict) -> "GptOssConfig":
        layers = config["num_hidden_layers"]
        return cls(
            hidden_size=config["hidden_size"],
            intermediate_size=config["intermediate_size"],
            num_hidden_layers=layers,
            num_attention_heads=config["num_attention_heads"],
            num_key_value_heads=config["num_key_value_heads"],
            head_dim=config.get("head_dim") or config["hidden_size"] // config["num_attention_heads"],
            num_local_experts=config["num_local_experts"],
            num_experts_per_tok=config.get("num_experts_per_tok") or config["experts_per_token"],
            vocab_size=config["vocab_size"],
            rms_norm_eps=config.get("rms_norm_eps", 1e-5),
            sliding_window=config.get("sliding_window", 128),
            layer_types=tuple(
                config.get("layer_types")
                or ["sliding_attention" if i % 2 == 0 else "full_attention" for i in range(layers)]
            ),
            rope_theta=config.get("rope_theta", 150000.0),
            rope_scaling=config.get("rope_scaling") or config.get("rope_parameters"),
            swiglu_limit=config.get("swiglu_limit", 7.0),
            swiglu_alpha=config.get("swiglu_alpha", 1.702),
            tie_word_embeddings=config.get("tie_word_embeddings", False),
        )


def expert_reader(config: GptOssConfig, checkpoint: Checkpoint):
    """(layer, expert) -> that expert's tensors as memory-mapped views, in checkpoint format."""
    c = config
    blocks_in, blocks_mid = c.hidden_size // 32, c.intermediate_size // 32
    mxfp4_shapes = {
        "gate_up_proj_blocks": (2 * c.intermediate_size, blocks_in, 16),
        "gate_up_proj_scales": (2 * c.intermediate_size, blocks_in),
        "gate_up_proj_bias": (2 * c.intermediate_size,),
        "down_proj_blocks": (c.hidden_size, blocks_mid, 16),
        "down_proj_scales": (c.hidden_size, blocks_mid),
        "down_proj_bias": (c.hidden_size,),
    }
    dense_shapes = {
        "gate_up_proj": (c.hidden_size, 2 * c.intermediate_size),
        "gate_up_proj_bias": (2 * c.intermediate_size,),
        "down_proj": (c.intermediate_size, c.hidden_size),
        "down_proj_bias": (c.hidden_size,),
    }
    is_mxfp4 = checkpoint.has("model.layers.0.mlp.experts.gate_up_proj_blocks")
    shapes = mxfp4_shapes if is_mxfp4 else dense_shapes
    stacked: dict[int, ExpertTensors] = {}

    def read(layer: int, expert: int) -> ExpertTensors:
        if layer not in stacked:
            prefix = f"model.layers.{layer}.mlp.experts."
            stacked[layer] = {
                name: checkpoint.tensor(prefix + name, (c.num_local_experts, *shape)) for name, shape in shapes.items()
            }
        return {name: tensor[expert] for name, tensor in stacked[layer].items()}

    return read


class GptOss(MoeDecoder):
    """Resident weights plus the shared expert cache."""

    def __init__(self, config: GptOssConfig, checkpoint: Checkpoint, experts: ExpertCache, dtype: torch.dtype):
        c = self.config = config
        self.experts = experts
        self.device = device = next(iter(experts.arenas.values())).device
        self.dtype = dtype
        heads, kv_heads, head_dim, hidden = c.num_attention_heads, c.num_key_value_heads, c.head_dim, c.hidden_size

        load = checkpoint.loader(device, dtype)

        self.embed = load("model.embed_tokens.weight", (c.vocab_size, hidden))
        self.lm_head = (
            self.embed if c.tie_word_embeddings else load("lm_head.weight", (c.vocab_size, hidden))
        )
        self.final_norm = load("model.norm.weight", (hidden,), keep_float32=True)
        self.layers = []
        for i in range(c.num_hidden_layers):
            p = f"model.layers.{i}."
            self.layers.append({
                "input_norm": load(p + "input_layernorm.weight", (hidden,), keep_float32=True),
                "post_norm": load(p + "post_attention_layernorm.weight", (hidden,), keep_float32=True),
                # q, k and v in one product: fewer launches per decode step
                "qkv": torch.cat([
                    load(p + "self_attn.q_proj.weight", (heads * head_dim, hidden)),
                    load(p + "self_attn.k_proj.weight", (kv_heads * head_dim, hidden)),
                    load(p + "self_attn.v_proj.weight", (kv_heads * head_dim, hidden)),
                ]),
                "qkv_bias": torch.cat([
                    load(p + "self_attn.q_proj.bias", (heads * head_dim,)),
                    load(p + "self_attn.k_proj.bias", (kv_heads * head_dim,)),
                    load(p + "self_attn.v_proj.bias", (kv_heads * head_dim,)),
                ]),
                "o": load(p + "self_attn.o_proj.weight", (hidden, heads * head_dim)),
                "o_bias": load(p + "self_attn.o_proj.bias", (hidden,)),
                "sinks": load(p + "self_attn.sinks", (heads,)),
                "router": load(p + "mlp.router.weight", (c.num_local_experts, hidden)),
                "router_bias": load(p + "mlp.router.bias", (c.num_local_experts,)),
            })
        self.rotary = Rotary(head_dim, c.rope_theta, c.rope_scaling, device)
        self.run_experts = gpt_oss_expert_op(device, c.swiglu_limit, c.swiglu_alpha,
                                             mxfp4="gate_up_proj_blocks" in experts.arenas)
        # fused kernels where Triton runs, their torch references elsewhere: fewer launches per decode step
        self.add_norm = add_rms_norm_op(device)
        self.rotary_write = rotary_cache_write_op(device)
        self.route = top_k_router_op(device)
        self.route_slots = top_k_router_slots_op(device)
        self.decode_attention = decode_attention if triton_runs(device) else None
        self.routing_override = None  # routing_override.py: benchmarks choose the experts instead of the router

    def new_kv_cache(self, capacity: int) -> KVCache:
        c = self.config
        shape = (c.num_key_value_heads, c.head_dim)
        return KVCache(c.num_hidden_layers, capacity, {"k": shape, "v": shape}, self.dtype, self.device)

    def attention_context(self, num_tokens: int, cache: KVCache) -> AttentionContext:
        positions = cache.positions(num_tokens)
        masks = {} if self._attends_in_kernel(num_tokens) else {
            window: causal_mask(positions, cache.num_rows(num_tokens), window)
            for window in (None, self.config.sliding_window)}
        return AttentionContext(positions, masks, *self.rotary.cos_sin(positions, self.dtype))

    def input_norm(self, index: int, x: torch.Tensor,
                   expert_output: torch.Tensor | PickRows | None) -> tuple[torch.Tensor, torch.Tensor]:
        return self.add_norm(x, expert_output, self.layers[index]["input_norm"], self.config.rms_norm_eps)

    def attend(self, index: int, normed: torch.Tensor, context: AttentionContext, cache: KVCache) -> torch.Tensor:
        return self._attention(index, self.layers[index], normed, context, cache)

    def until_routed(self, index: int, x: torch.Tensor, attended: torch.Tensor) -> tuple[torch.Tensor, Routing]:
        layer, eps = self.layers[index], self.config.rms_norm_eps
        num_pairs = len(x) * self.config.num_experts_per_tok
        if self.experts.takes_hidden_pairs(self.run_experts, num_pairs, x.dtype):  # the experts' inputs from the norm
            x, normed, hidden_pairs = add_rms_norm_half_pairs(x, attended, layer["post_norm"], eps)
            return x, self._routing(index, layer, normed)._replace(hidden_pairs=hidden_pairs)
        x, normed = self.add_norm(x, attended, layer["post_norm"], eps)
        return x, self._routing(index, layer, normed)

    def routed_experts(self, index: int, routing: Routing) -> torch.Tensor | PickRows:
        return self.experts.run(index, routing.hidden, routing.top_experts, routing.top_weights, self.run_experts,
                                routing.predictions, slots=routing.slots, hidden_pairs=routing.hidden_pairs)

    def route_embedding(self, index: int, embedded: torch.Tensor) -> torch.Tensor:
        layer = self.layers[index]
        return self._route(layer, rms_norm(embedded, layer["post_norm"], self.config.rms_norm_eps))[0]

    def _attends_in_kernel(self, num_tokens: int) -> bool:
        """One token or a verify block (up to 16 tokens) where the kernel runs."""
        c = self.config
        return self.decode_attention is not None and takes_queries(num_tokens, c.num_attention_heads,
                                                                   c.num_key_value_heads)

    def _attention(self, index, layer, x, context: AttentionContext, cache: KVCache) -> torch.Tensor:
        c = self.config
        heads, kv_heads = c.num_attention_heads, c.num_key_value_heads
        qkv = linear(x, layer["qkv"], layer["qkv_bias"]).unflatten(-1, (heads + 2 * kv_heads, c.head_dim))
        keys, values = cache.layer_rows(index, "k"), cache.layer_rows(index, "v")  # [capacity, kv_heads, d]
        q = self.rotary_write(qkv, context.cos, context.sin, context.positions, keys, values)
        window = c.sliding_window if c.layer_types[index] == "sliding_attention" else None
        if self._attends_in_kernel(len(x)):
            out = self.decode_attention(q, keys, values, context.positions, c.head_dim**-0.5, layer["sinks"], window)
        else:
            rows = cache.num_rows(len(x))
            out = attend(q, keys[:rows], values[:rows], context.masks[window], c.head_dim**-0.5, sinks=layer["sinks"])
        return linear(out.flatten(-2), layer["o"], layer["o_bias"])

    def _routing(self, index, layer, x) -> Routing:
        lookup = self.experts.resident_lookup(index, len(x)) if self.routing_override is None else None
        slots = None
        if lookup is not None:  # the router's launch looks the slots up too
            top_experts, top_weights, slots = self.route_slots(x, layer["router"], layer["router_bias"],
                                                               self.config.num_experts_per_tok, *lookup)
        elif self.routing_override is None:
            top_experts, top_weights = self._route(layer, x)
        else:  # the router's logits weight the experts chosen for it
            top_experts = self.routing_override.experts(index, len(x))
            top_weights = torch.softmax(self._router_logits(layer, x).gather(1, top_experts), dim=-1)
        predictions = {
            later: self._route(self.layers[later], x)[0] for later in self.experts.lookahead_layers(index, len(x))
        }
        return Routing(x, top_experts, top_weights, predictions, slots=slots)

    def _route(self, layer, x) -> tuple[torch.Tensor, torch.Tensor]:
        """x [T, H] normed -> top-k experts and their softmax weights [T, k]."""
        return self.route(x, layer["router"], layer["router_bias"], self.config.num_experts_per_tok)

    def _router_logits(self, layer, x) -> torch.Tensor:
        return torch.addmm(layer["router_bias"], x, layer["router"].T)  # [T, E]
