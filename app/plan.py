"""Where every byte goes: the placement of a model under a GPU and a RAM budget (pure Python).

The engine obeys the placement exactly; an impossible budget is refused here, before anything is
allocated.
"""

from dataclasses import dataclass

from app.errors import UserError
from app.model_folder import DTYPE_BYTES, ModelFolder, TensorInfo
from app.quantization import is_fp8_scale
from app.sizes import format_size

ROUTED_EXPERT_MARK = ".mlp.experts."
PREFILL_CHUNK = 256


@dataclass(frozen=True)
class ModelFacts:
    """What the planner and the engine need to know about a checkpoint, read from its headers.

    Routed experts of an MTP layer (GLM's layer `num_hidden_layers`) are routed experts like any other:
    they are in `moe_layers` and the expert store. The MTP layer's other weights (`mtp_weights`) and its
    KV cache are not part of the target's resident weights and cache: they are loaded only to draft.
    """

    model_type: str
    num_layers: int
    moe_layers: tuple[int, ...]
    num_experts: int  # routed experts per MoE layer
    top_k: int
    expert_bytes: int  # one routed expert in its checkpoint format (FP8 scales included)
    expert_weights: int  # elements of one routed expert once dequantized
    resident_weights: int  # elements of everything the target runs that is not a routed expert
    mtp_weights: int  # elements of the MTP layer that are not routed experts (0: no MTP layer)
    kv_per_token: int  # the target's cache elements per token over all layers
    hidden_size: int
    vocab_size: int

    @property
    def total_experts(self) -> int:
        return self.num_experts * len(self.moe_layers)

    @property
    def expert_bytes_per_token(self) -> int:
        """Routed-expert bytes one token reads in one target forward pass (top-k in every MoE layer)."""
        return self.top_k * self.expert_bytes * sum(layer < self.num_layers for layer in self.moe_layers)

    def resident_bytes(self, dtype_bytes: int) -> int:
        """The target's non-expert weights on the device (FP8 ones are dequantized to the compute dtype)."""
        return self.resident_weights * dtype_bytes

    def kv_bytes_per_token(self, dtype_bytes: int) -> int:
        return self.kv_per_token * dtype_bytes

    @classmethod
    def from_folder(cls, folder: ModelFolder) -> "ModelFacts":
        config = folder.config
        num_layers = config["num_hidden_layers"]
        num_experts = config.get("num_local_experts") or config["n_routed_experts"]
        mtp_prefix = f"model.layers.{num_layers}."
        expert_bytes = expert_weights = resident_weights = mtp_weights = 0
        moe_layers = set()
        for info in folder.tensors.values():
            if ROUTED_EXPERT_MARK in info.name:
                moe_layers.add(int(info.name.split(".")[2]))
                expert_bytes += info.nbytes
                expert_weights += _dequantized_elements(info)
            elif info.name.startswith(mtp_prefix):
                mtp_weights += _dequantized_elements(info)
            else:
                resident_weights += _dequantized_elements(info)
        count = max(len(moe_layers), 1) * num_experts
        return cls(
            model_type=folder.model_type,
            num_layers=num_layers,
            moe_layers=tuple(sorted(moe_layers)),
            num_experts=num_experts,
            top_k=config.get("num_experts_per_tok") or config["experts_per_token"],
            expert_bytes=expert_bytes // count,
            expert_weights=expert_weights // count,
            resident_weights=resident_weights,
            mtp_weights=mtp_weights,
            kv_per_token=_kv_per_token(config),
            hidden_size=config["hidden_size"],
            vocab_size=config["vocab_size"],
        )


def _dequantized_elements(info: TensorInfo) -> int:
    if info.name.endswith("_blocks"):
        return 2 * info.numel  # two e2m1 values per byte
    if info.name.endswith("_scales") or is_fp8_scale(info.name):
        return 0
    return info.numel


def _kv_per_token(config: dict) -> int:
    layers = config["num_hidden_layers"]
    if "kv_lora_rank" in config:  # MLA: the latent and the shared rope key, plus DSA's indexer keys
        latent = layers * (config["kv_lora_rank"] + config["qk_rope_head_dim"])
        if config["model_type"] != "glm_moe_dsa":
            return latent
        return latent + dsa_indexer_types(config).count("full") * config.get("index_head_dim", 128)
    head_dim = config.get("head_dim") or config["hidden_size"] // config["num_attention_heads"]
    return layers * 2 * config["num_key_value_heads"] * head_dim


def dsa_indexer_types(config: dict) -> tuple[str, ...]:
    """Per GLM-5 layer, "full" (runs the DSA indexer) or "shared" (reuses the top-k of the last full layer),
    derived as transformers does when config.json has no `indexer_types`."""
    if config.get("indexer_types"):
        return tuple(config["indexer_types"])
    pattern = config.get("index_topk_pattern")
    if isinstance(pattern, str):
        return tuple({"F": "full", "S": "shared"}[letter] for letter in pattern)
    if pattern is not None:
        return tuple(pattern)
    frequency = max(config.get("index_topk_freq", 1), 1)
    offset = config.get("index_skip_topk_offset", 2)
    layers = range(config["num_hidden_layers"])
    return tuple("full" if max(i - offset + 1, 0) % frequency == 0 else "shared" for i in layers)


@dataclass(frozen=True)
class Placement:
    """Bytes on the compute device, experts in pinned RAM, experts left on disk."""

    resident_bytes: int
    kv_cache_bytes: int
    workspace_bytes: int
    expert_bytes: int
    expert_slots: int
    host_experts: int
    disk_experts: int
    context: int

    @property
    def slot_bytes(self) -> int:
        return self.expert_slots * self.expert_bytes

    @property
    def device_bytes(self) -> int:
        return self.resident_bytes + self.kv_cache_bytes + self.workspace_bytes + self.slot_bytes

    @property
    def host_bytes(self) -> int:
        return self.host_experts * self.expert_bytes

    @property
    def disk_bytes(self) -> int:
        return self.disk_experts * self.expert_bytes


def plan_placement(
    facts: ModelFacts, gpu_budget: int | None, ram_budget: int | None, context: int, dtype_bytes: int
) -> Placement:
    """None for a budget means "no limit". Raises UserError when the model cannot run in the budget."""
    resident = facts.resident_bytes(dtype_bytes)
    kv_cache = facts.kv_bytes_per_token(dtype_bytes) * context
    workspace = (facts.expert_weights + PREFILL_CHUNK * (facts.vocab_size + 16 * facts.hidden_size)) * dtype_bytes
    fixed = resident + kv_cache + workspace
    total = facts.total_experts
    if gpu_budget is None:
        slots = total
    else:
        slots = min(total, max(gpu_budget - fixed, 0) // facts.expert_bytes)
        if slots < min(facts.top_k, total):
            needed = fixed + facts.top_k * facts.expert_bytes
            raise UserError(
                f"GPU budget {format_size(gpu_budget)} is too small: this model needs at least "
                f"{format_size(needed)} (resident weights {format_size(resident)}, KV cache "
                f"{format_size(kv_cache)} for {context} tokens, workspace {format_size(workspace)}, "
                f"{facts.top_k} expert slots); raise --gpu-budget or shorten the context"
            )
    host = total if ram_budget is None else min(total, max(ram_budget, 0) // facts.expert_bytes)
    return Placement(resident, kv_cache, workspace, facts.expert_bytes, slots, host, total - host, context)


def dtype_bytes(dtype_name: str) -> int:
    return {"float32": DTYPE_BYTES["F32"], "bfloat16": DTYPE_BYTES["BF16"], "float16": DTYPE_BYTES["F16"]}[dtype_name]
