"""Where every byte goes: the placement of a model under a GPU and a RAM budget (pure Python).

The engine obeys the placement exactly; an impossible budget is refused here, before anything is
allocated.
"""

from dataclasses import dataclass

from app.errors import UserError
from app.model_folder import DTYPE_BYTES, ModelFolder
from app.sizes import format_size

ROUTED_EXPERT_MARK = ".mlp.experts."
PREFILL_CHUNK = 256


@dataclass(frozen=True)
class ModelFacts:
    """What the planner and the engine need to know about a checkpoint, read from its headers."""

    model_type: str
    num_layers: int
    moe_layers: tuple[int, ...]
    num_experts: int  # routed experts per MoE layer
    top_k: int
    expert_bytes: int  # one routed expert in its checkpoint format
    expert_weights: int  # elements of one routed expert once dequantized
    resident_weights: int  # elements of everything that is not a routed expert
    kv_per_token: int  # cache elements per token over all layers
    hidden_size: int
    vocab_size: int

    @property
    def total_experts(self) -> int:
        return self.num_experts * len(self.moe_layers)

    @classmethod
    def from_folder(cls, folder: ModelFolder) -> "ModelFacts":
        config = folder.config
        num_layers = config["num_hidden_layers"]
        num_experts = config["num_local_experts"]
        expert_bytes = expert_weights = resident_weights = 0
        moe_layers = set()
        for info in folder.tensors.values():
            if ROUTED_EXPERT_MARK not in info.name:
                resident_weights += info.numel
                continue
            moe_layers.add(int(info.name.split(".")[2]))
            expert_bytes += info.nbytes
            if info.name.endswith("_blocks"):
                expert_weights += 2 * info.numel  # two e2m1 values per byte
            elif not info.name.endswith("_scales"):
                expert_weights += info.numel
        count = max(len(moe_layers), 1) * num_experts
        head_dim = config.get("head_dim") or config["hidden_size"] // config["num_attention_heads"]
        return cls(
            model_type=folder.model_type,
            num_layers=num_layers,
            moe_layers=tuple(sorted(moe_layers)),
            num_experts=num_experts,
            top_k=config.get("num_experts_per_tok") or config["experts_per_token"],
            expert_bytes=expert_bytes // count,
            expert_weights=expert_weights // count,
            resident_weights=resident_weights,
            kv_per_token=num_layers * 2 * config["num_key_value_heads"] * head_dim,
            hidden_size=config["hidden_size"],
            vocab_size=config["vocab_size"],
        )


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
    resident = facts.resident_weights * dtype_bytes
    kv_cache = facts.kv_per_token * context * dtype_bytes
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
