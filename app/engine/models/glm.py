"""The decoder every GLM MoE shares: dense MLPs on the first layers, then MoE layers whose sigmoid router
("noaux_tc": float32 scores, a correction bias used only for choosing, group limiting) picks routed SiLU
experts, plus a shared expert. Attention is the architecture's own: GQA (glm4_moe.py), MLA (mla.py), DSA
(glm_moe_dsa.py).
"""

from dataclasses import MISSING, dataclass, fields

import torch

from app.engine.experts.cache import ExpertCache
from app.engine.experts.store import ExpertTensors, Routing
from app.engine.layers.kv_cache import KVCache
from app.engine.layers.linear import Fp8Weight, linear, load_linear, stacked_rows
from app.engine.layers.ops import causal_mask, silu_glu
from app.engine.layers.rope import Rotary
from app.engine.models.glm_mtp import GlmMtp
from app.engine.models.moe_decoder import MoeDecoder
from app.engine.weights.checkpoint import Checkpoint
from app.errors import UserError
from app.kernels.expert_table import address_row
from app.kernels.glu_experts import PROJECTIONS, glu_expert_op
from app.kernels.norms import add_rms_norm_op, rms_norm
from app.kernels.sigmoid_router import (
    SigmoidRouting,
    sigmoid_router_op,
    sigmoid_router_slots_op,
    sigmoid_router_torch,
)
from app.quantization import BLOCK_SCALE, PER_CHANNEL_SCALE


@dataclass(frozen=True)
class GlmConfig:
    """config.json keys every GLM MoE has; optional ones default as in transformers."""

    hidden_size: int
    intermediate_size: int
    moe_intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    n_routed_experts: int
    num_experts_per_tok: int
    vocab_size: int
    n_shared_experts: int = 1
    n_group: int = 1
    topk_group: int = 1
    norm_topk_prob: bool = True
    routed_scaling_factor: float = 1.0
    first_k_dense_replace: int = 1
    mlp_layer_types: tuple[str, ...] | None = None
    rms_norm_eps: float = 1e-5
    rope_theta: float = 10000.0
    rope_scaling: dict | None = None
    rope_parameters: dict | None = None
    tie_word_embeddings: bool = False

    @classmethod
    def from_dict(cls, config: dict) -> "GlmConfig":
        missing = [f.name for f in fields(cls) if f.default is MISSING and f.name not in config]
        if missing:
            raise KeyError(missing[0])
        return cls(**{
            f.name: tuple(value) if isinstance(value := config[f.name], list) else value
            for f in fields(cls) if f.name in config
        })

    def is_moe_layer(self, index: int) -> bool:
        if index >= self.num_hidden_layers:
            return True  # the MTP layer
        if self.mlp_layer_types:
            return self.mlp_layer_types[index] == "sparse"
        return index >= self.first_k_dense_replace

    @property
    def routing(self) -> SigmoidRouting:
        return SigmoidRouting(self.num_experts_per_tok, self.n_group, self.topk_group, self.norm_topk_prob,
                              self.routed_scaling_factor)

    @property
    def rope(self) -> tuple[float, dict | None]:
        # transformers-5 files say `rope_parameters`, older ones `rope_theta`/`rope_scaling`
        theta = (self.rope_parameters or {}).get("rope_theta", self.rope_theta)
        return theta, self.rope_scaling or self.rope_parameters


@dataclass
class Step:
    positions: torch.Tensor  # [T]
    cos: torch.Tensor  # [T, rotary_dim / 2]
    sin: torch.Tensor
    visible: torch.Tensor  # [T, L] causal mask over the cached and the new tokens
    selected: torch.Tensor | None = None  # DSA: [T, L] keys chosen by the last layer that ran its indexer


def expert_reader(config: GlmConfig, checkpoint: Checkpoint):
    """(layer, expert) -> `{gate,up,down}_proj.weight` (+ FP8 scales) as stored; every expert must share one format."""
    width, hidden = config.moe_intermediate_size, config.hidden_size
    shapes = {"gate_proj": (width, hidden), "up_proj": (width, hidden), "down_proj": (hidden, width)}
    first: list[tuple[int, int, dict]] = []

    def read(layer: int, expert: int) -> ExpertTensors:
        prefix = f"model.layers.{layer}.mlp.experts.{expert}."
        tensors = {
            f"{projection}.{key}": tensor
            for projection in PROJECTIONS
            for key, tensor in checkpoint.stored_weight(prefix + projection, shapes[projection]).items()
        }
        layout = {name: (str(t.dtype).removeprefix("torch."), list(t.shape)) for name, t in tensors.items()}
        if not first:
            first.append((layer, expert, layout))
        elif layout != first[0][2]:
            first_layer, first_expert, first_layout = first[0]
            raise UserError(
                f"expert {expert} of layer {layer} is stored as {layout} but expert {first_expert} of layer "
                f"{first_layer} as {first_layout}: every routed expert must have one format"
            )
        return tensors

    return read


def route(x: torch.Tensor, router: torch.Tensor, correction_bias: torch.Tensor, config: GlmConfig,
          chosen: torch.Tensor | None = None):
    """x [T, H], router [E, H], correction_bias [E] float32 -> (experts [T, k], weights [T, k] in x's dtype);
    given `chosen` [T, k] (routing_override.py), only weights those."""
    return sigmoid_router_torch(x, router, correction_bias, config.routing, chosen)


class DenseMlp:
    """Gate and up in one product where they stack (SiLU(gate) * up in its epilogue), the residual added in
    down's."""

    def __init__(self, model: "GlmModel", prefix: str, width: int):
        hidden = model.config.hidden_size
        gate = model.weight(prefix + "gate_proj", (width, hidden))
        up = model.weight(prefix + "up_proj", (width, hidden))
        self.gate_up = stacked_rows([gate, up])
        self.gate, self.up = (gate, up) if self.gate_up is None else (None, None)
        self.down = model.weight(prefix + "down_proj", (hidden, width))

    def as_expert(self, arenas: dict[str, torch.Tensor]) -> torch.Tensor | None:
        """The address row (expert_table.address_row) of these weights as one more expert of `arenas`, or None where
        they are not in the routed experts' format and width (other dtypes or scales, gate and up apart)."""
        gate_up, down = self.gate_up, self.down
        if isinstance(gate_up, torch.Tensor) and isinstance(down, torch.Tensor):
            gate, up = gate_up.chunk(2)  # gate rows, up rows
            return address_row({"gate_proj.weight": gate, "up_proj.weight": up, "down_proj.weight": down}, arenas)
        if not (isinstance(gate_up, Fp8Weight) and isinstance(down, Fp8Weight)):
            return None
        scale = BLOCK_SCALE if gate_up.block is not None else PER_CHANNEL_SCALE
        (gate, up), (gate_scale, up_scale) = gate_up.weight.chunk(2), gate_up.scale.chunk(2)  # gate rows, up rows
        return address_row({"gate_proj.weight": gate, f"gate_proj.{scale}": gate_scale, "up_proj.weight": up,
                            f"up_proj.{scale}": up_scale, "down_proj.weight": down.weight,
                            f"down_proj.{scale}": down.scale}, arenas)

    def __call__(self, x: torch.Tensor, residual: torch.Tensor | None = None) -> torch.Tensor:
        """x [T, H] -> the MLP's output [T, H], plus `residual` where given."""
        if self.gate_up is None:
            out = silu_glu(x, self.gate, self.up, self.down)
            return out if residual is None else residual + out
        return linear(linear(x, self.gate_up, glu=True), self.down, residual=residual)


class RoutedMoe:
    """Routed experts from the cache, an unscaled shared expert beside them: as one more pick of the routed experts'
    launches where their op takes it (one token's experts, FP8 or 16-bit, all resident), else its own MLP. While
    experts are offloaded, this layer's input also predicts the next MoE layers' experts (their routers on it) so
    copies start early."""

    def __init__(self, model: "GlmModel", index: int):
        c = model.config
        prefix = f"model.layers.{index}.mlp."
        self.index = index
        self.config = c
        self.model = model
        self.experts = model.experts
        self.run_experts = model.run_experts
        self.moe_layers = model.moe_layers  # index -> RoutedMoe, for the look-ahead
        self.router = model.tensor(prefix + "gate.weight", (c.n_routed_experts, c.hidden_size), float32=True)
        self.correction_bias = model.tensor(prefix + "gate.e_score_correction_bias", (c.n_routed_experts,),
                                            float32=True)
        self.shared = DenseMlp(model, prefix + "shared_experts.", c.moe_intermediate_size * c.n_shared_experts)
        self.shared_row = self.shared.as_expert(self.experts.arenas)
        self.route = model.route
        self.route_slots = model.route_slots

    def choose(self, x: torch.Tensor) -> torch.Tensor:
        return self.route(x, self.router, self.correction_bias, self.config.routing)[0]

    def routing(self, x: torch.Tensor) -> Routing:
        override = self.model.routing_override
        lookup = self.experts.resident_lookup(self.index, len(x)) if override is None else None
        slots = None
        if lookup is not None:  # the router's launch looks the slots up too
            experts, weights, slots = self.route_slots(x, self.router, self.correction_bias, self.config.routing,
                                                       *lookup)
        elif override is None:
            experts, weights = self.route(x, self.router, self.correction_bias, self.config.routing)
        else:
            chosen = override.experts(self.index, len(x))
            experts, weights = route(x, self.router, self.correction_bias, self.config, chosen)
        predictions = {
            later: self.moe_layers[later].choose(x)
            for later in self.experts.lookahead_layers(self.index, len(x))
            if later in self.moe_layers
        }
        shared = self.shared_row is not None and self.experts.takes_shared(self.run_experts, len(x))
        return Routing(x, experts, weights, predictions, self.shared_row if shared else None, slots)

    def routed(self, routing: Routing) -> torch.Tensor:
        """The routed experts' sum, the shared expert's output in it where `routing.shared`."""
        return self.experts.run(self.index, routing.hidden, routing.top_experts, routing.top_weights,
                                self.run_experts, routing.predictions, shared=routing.shared, slots=routing.slots)


class GlmLayer:
    """Pre-norm attention, then a pre-norm dense MLP or MoE, each added to the residual stream."""

    def __init__(self, model: "GlmModel", index: int, cache_layer: int):
        c = model.config
        prefix = f"model.layers.{index}."
        self.eps = c.rms_norm_eps
        self.add_norm = model.add_norm
        self.input_norm = model.tensor(prefix + "input_layernorm.weight", (c.hidden_size,), float32=True)
        self.post_norm = model.tensor(prefix + "post_attention_layernorm.weight", (c.hidden_size,), float32=True)
        self.attention = model.attention(index, cache_layer)
        self.moe = RoutedMoe(model, index) if c.is_moe_layer(index) else None
        if self.moe is not None:
            model.moe_layers[index] = self.moe
        # what runs on every token beside the routed experts: the shared expert, or the dense MLP
        self.mlp = self.moe.shared if self.moe is not None else DenseMlp(model, prefix + "mlp.", c.intermediate_size)

    def __call__(self, x: torch.Tensor, step: Step, cache: KVCache) -> torch.Tensor:
        attended = self.attention(self.add_norm(x, None, self.input_norm, self.eps)[1], step, cache)
        return self.with_routed_experts(*self.until_routed(x, attended))

    def with_routed_experts(self, residual: torch.Tensor, routing: Routing | None) -> torch.Tensor:
        return residual if routing is None else residual + self.moe.routed(routing)

    def until_routed(self, x: torch.Tensor, attended: torch.Tensor) -> tuple[torch.Tensor, Routing | None]:
        """x [T, H] before attention, attended [T, H] -> (x + attended + the MLP beside the routed experts unless
        the routed experts' op runs the shared expert (`routing.shared`), routing)."""
        x, normed = self.add_norm(x, attended, self.post_norm, self.eps)
        if self.moe is None:
            return self.mlp(normed, residual=x), None
        routing = self.moe.routing(normed)
        return (x if routing.shared is not None else self.mlp(normed, residual=x)), routing


class GlmModel(MoeDecoder):
    """Subclasses give `rotary_dim`, `attention(index, cache_layer)` and `kv_cache(capacity, layers)` (a cache
    for the given checkpoint layers, in that order)."""

    rotary_dim: int

    def __init__(self, config: GlmConfig, checkpoint: Checkpoint, experts: ExpertCache, dtype: torch.dtype):
        c = self.config = config
        self.checkpoint = checkpoint
        self.experts = experts
        self.device = next(iter(experts.arenas.values())).device
        self.dtype = dtype
        self.run_experts = glu_expert_op(self.device, checkpoint.folder.quantization.fp8_block)
        # fused kernels where Triton runs, their torch references elsewhere: fewer launches per decode step
        self.add_norm = add_rms_norm_op(self.device)
        self.route = sigmoid_router_op(self.device)
        self.route_slots = sigmoid_router_slots_op(self.device)
        self.routing_override = None  # routing_override.py: benchmarks choose the experts instead of the router
        vocab, hidden = c.vocab_size, c.hidden_size
        self.embed = self.tensor("model.embed_tokens.weight", (vocab, hidden))
        self.lm_head = self.embed if c.tie_word_embeddings else self.weight("lm_head", (vocab, hidden))
        self.final_norm = self.tensor("model.norm.weight", (hidden,), float32=True)
        self.moe_layers: dict[int, RoutedMoe] = {}  # filled as the layers are built
        self.layers = [GlmLayer(self, index, cache_layer=index) for index in range(c.num_hidden_layers)]
        theta, scaling = c.rope
        self.rotary = Rotary(self.rotary_dim, theta, scaling, self.device)

    def attention(self, index: int, cache_layer: int):
        raise NotImplementedError

    def kv_cache(self, capacity: int, layers: list[int]) -> KVCache:
        raise NotImplementedError

    def tensor(self, name: str, shape: tuple[int, ...], float32: bool = False) -> torch.Tensor:
        return self.checkpoint.tensor(name, shape).to(self.device, torch.float32 if float32 else self.dtype)

    def weight(
        self, module: str, shape: tuple[int, ...], float32: bool = False, dequantized: bool = False
    ) -> torch.Tensor | Fp8Weight:
        """[out, in] for `linear`: FP8 stays FP8 on a GPU unless `float32` or `dequantized` (not used as x @ W.T)."""
        dtype = torch.float32 if float32 else self.dtype
        if float32 or dequantized:
            return self.checkpoint.dequantized(module, shape, self.device, dtype)
        stored = self.checkpoint.stored_weight(module, shape)
        return load_linear(stored, self.checkpoint.folder.quantization.fp8_block, self.device, dtype)

    def new_kv_cache(self, capacity: int) -> KVCache:
        return self.kv_cache(capacity, list(range(self.config.num_hidden_layers)))

    def attention_context(self, num_tokens: int, cache: KVCache) -> Step:
        positions = cache.positions(num_tokens)
        cos, sin = self.rotary.cos_sin(positions, self.dtype)
        return Step(positions, cos, sin, causal_mask(positions, cache.num_rows(num_tokens), None))

    def input_norm(self, index: int, x: torch.Tensor,
                   expert_output: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor]:
        return self.add_norm(x, expert_output, self.layers[index].input_norm, self.config.rms_norm_eps)

    def attend(self, index: int, normed: torch.Tensor, context: Step, cache: KVCache) -> torch.Tensor:
        return self.layers[index].attention(normed, context, cache)

    def until_routed(self, index: int, x: torch.Tensor, attended: torch.Tensor) -> tuple[torch.Tensor, Routing | None]:
        return self.layers[index].until_routed(x, attended)

    def routed_experts(self, index: int, routing: Routing) -> torch.Tensor:
        return self.layers[index].moe.routed(routing)

    def route_embedding(self, index: int, embedded: torch.Tensor) -> torch.Tensor:
        return self.moe_layers[index].choose(rms_norm(embedded, self.layers[index].post_norm, self.config.rms_norm_eps))

    def load_mtp(self) -> GlmMtp:
        """The MTP layer (index `num_hidden_layers`) as a drafter (glm_mtp.py); its routed experts share the cache.
        It reads the target's final hidden states: `forward(..., capture=(num_hidden_layers - 1,))`."""
        index = self.config.num_hidden_layers
        marker = f"model.layers.{index}.eh_proj.weight"
        if not self.checkpoint.has(marker):
            raise UserError(
                f"the checkpoint in '{self.checkpoint.folder.path}' has no MTP layer ({marker} is missing), so "
                "multi-token prediction is unavailable for it: generate without --spec mtp"
            )
        return GlmMtp(self, index, GlmLayer(self, index, cache_layer=0))
