"""Where every byte goes: the placement of a model under a GPU and a RAM budget (pure Python).

The engine obeys the placement exactly; an impossible budget is refused here, before anything is
allocated.
"""

import json
from dataclasses import dataclass

from app.curves import interpolated
from app.errors import UserError
from app.model_folder import DTYPE_BYTES, ModelFolder, TensorInfo
from app.plan_cpu_tier import HOST_CPU_EXPERTS, CpuExpertRates, cpu_tier_idle, expected_share
from app.quantization import is_fp8_scale
from app.sizes import format_size

ROUTED_EXPERT_MARK = ".mlp.experts."
PREFILL_CHUNK = 256
RUNTIME_RESERVE = 64 << 20
ROUTING_FILE = "routing.json"
FP8_DTYPE = "F8_E4M3"
DEQUANTIZED_FP8 = ".kv_b_proj."  # MLA's kv_b is used per head, not as x @ W.T: the engine dequantizes it at load


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
    attention_heads: int = 0
    # (share of a layer's experts cached, the expert cache's hit rate) measured on real text, from the folder's
    # routing.json (see `read_routing`); empty: only the uniform-routing bound is known
    measured_hit_rates: tuple[tuple[float, float], ...] = ()
    resident_fp8_weights: int = 0  # elements of the resident weights stored as FP8 that the engine can keep FP8
    resident_fp8_bytes: int = 0  # those weights as stored, their scales included
    fp8_kept: bool = False  # the engine keeps them FP8 (on a GPU: app/engine/layers/linear.py)
    mxfp4_experts: bool = False  # the routed experts are MXFP4 blocks and scales (gpt-oss as published)
    latent_attention: bool = False  # multi-head latent attention (MLA: GLM-4.7-Flash, GLM-5; engine/models/mla.py)

    @property
    def total_experts(self) -> int:
        return self.num_experts * len(self.moe_layers)

    @property
    def expert_bytes_per_token(self) -> int:
        """Routed-expert bytes one token reads in one target forward pass (top-k in every MoE layer)."""
        return self.top_k * self.expert_bytes * sum(layer < self.num_layers for layer in self.moe_layers)

    def resident_bytes(self, dtype_bytes: int) -> int:
        """The target's non-expert weights on the device: FP8 ones as stored where the engine keeps them FP8
        (`fp8_kept`), otherwise dequantized to the compute dtype."""
        if not self.fp8_kept:
            return self.resident_weights * dtype_bytes
        return (self.resident_weights - self.resident_fp8_weights) * dtype_bytes + self.resident_fp8_bytes

    def kv_bytes_per_token(self, dtype_bytes: int) -> int:
        return self.kv_per_token * dtype_bytes

    @classmethod
    def from_folder(cls, folder: ModelFolder, fp8_kept: bool = False) -> "ModelFacts":
        """`fp8_kept`: the engine will keep dense FP8 weights FP8 (it does on a GPU)."""
        try:
            facts = cls._from_config(folder, fp8_kept)
        except KeyError as missing:
            raise UserError(f"config.json in '{folder.path}' lacks the key {missing}") from None
        except (TypeError, ValueError) as error:
            raise UserError(f"config.json in '{folder.path}' has a value of the wrong type ({error}): fix it or "
                            "download the model again") from None
        for name in ("num_layers", "num_experts", "top_k", "hidden_size", "vocab_size", "attention_heads"):
            value = getattr(facts, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise UserError(f"config.json in '{folder.path}' has a value of the wrong type: its {name} is "
                                f"{value!r}, where a whole number above 0 belongs")
        return facts

    @classmethod
    def _from_config(cls, folder: ModelFolder, fp8_kept: bool) -> "ModelFacts":
        config = folder.config
        num_layers = config["num_hidden_layers"]
        num_experts = config.get("num_local_experts") or config["n_routed_experts"]
        mtp_prefix = f"model.layers.{num_layers}."
        expert_bytes = expert_weights = resident_weights = mtp_weights = fp8_weights = fp8_bytes = 0
        moe_layers, mxfp4_experts = set(), False
        for info in folder.tensors.values():
            if ROUTED_EXPERT_MARK in info.name:
                moe_layers.add(int(info.name.split(".")[2]))
                mxfp4_experts |= info.name.endswith("_blocks")
                expert_bytes += info.nbytes
                expert_weights += _dequantized_elements(info)
            elif info.name.startswith(mtp_prefix):
                mtp_weights += _dequantized_elements(info)
            else:
                resident_weights += _dequantized_elements(info)
                if (info.dtype == FP8_DTYPE or is_fp8_scale(info.name)) and DEQUANTIZED_FP8 not in info.name:
                    fp8_weights += info.numel if info.dtype == FP8_DTYPE else 0
                    fp8_bytes += info.nbytes
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
            attention_heads=config["num_attention_heads"],
            measured_hit_rates=read_routing(folder, num_experts),
            resident_fp8_weights=fp8_weights,
            resident_fp8_bytes=fp8_bytes,
            fp8_kept=fp8_kept,
            mxfp4_experts=mxfp4_experts,
            latent_attention="kv_lora_rank" in config,
        )


def read_routing(folder: ModelFolder, num_experts: int) -> tuple[tuple[float, float], ...]:
    """A model folder may carry `routing.json`: {"hit_rate": {"<slots per layer>": hit rate, …}}, the hit
    rate of the engine's expert cache (that many slots per layer, its own eviction policy) over the model's
    routing of real text. Returns (share of the layer's experts, hit rate) points in order; () when the
    file is absent."""
    path = folder.path / ROUTING_FILE
    if not path.exists():
        return ()
    try:
        rates = json.loads(path.read_text())["hit_rate"]
        return tuple(sorted((int(slots) / num_experts, float(rate)) for slots, rate in rates.items()))
    except (ValueError, KeyError, TypeError, AttributeError):
        raise UserError(f"{path} is not a routing record ({{\"hit_rate\": {{slots: rate}}}}): fix or "
                        "delete it") from None


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
    # a dequantized expert (the torch op), a prefill chunk's activations and its attention scores (a few
    # copies of [heads, chunk, context]), and room for the allocator's rounding and CUDA graph pools
    chunk = min(PREFILL_CHUNK, context)
    activations = chunk * (facts.vocab_size + 16 * facts.hidden_size) + 4 * facts.attention_heads * chunk * context
    workspace = (facts.expert_weights + activations) * dtype_bytes + RUNTIME_RESERVE
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
                f"{facts.top_k} expert slots); raise the GPU budget or shorten the context"
            )
    host = total if ram_budget is None else min(total, max(ram_budget, 0) // facts.expert_bytes)
    return Placement(resident, kv_cache, workspace, facts.expert_bytes, slots, host, total - host, context)


def dtype_bytes(dtype_name: str) -> int:
    return {"float32": DTYPE_BYTES["F32"], "bfloat16": DTYPE_BYTES["BF16"], "float16": DTYPE_BYTES["F16"]}[dtype_name]


# The performance model. Desktop defaults from performance.md: pinned host->device copies over PCIe x16,
# datasheet memory bandwidth per card.
PCIE_BPS = {3: 12e9, 4: 25e9, 5: 55e9}
CARD_MEMORY_BPS = {"RTX 4090": 1.0e12, "RTX 5090": 1.8e12, "H100": 3.35e12, "H200": 4.8e12}


@dataclass(frozen=True)
class LayerOverheads:
    """Engine time per layer and token beyond the roofline: kernel launches, the host's read of the routing,
    issuing the copies (bench/NOTES.md has each fit's runs and the earlier fits). Resident: fitted to gpt-oss-20b's
    current step on an H100 (523.7-541.8 tok/s over three leases, 2026-12-06). -120b and GLM-4.5-Air-FP8 were last
    timed with an older step, 8 and 16 µs a layer over -20b, so their predictions are likely high by about as much.
    Only the roofline scales with the card's bandwidth, so on an H200, where the one-token kernels are bound by their
    instructions, the prediction is likely high too. Misses served on the device, whose steps wait for their tokens:
    fitted to gpt-oss-20b's runs at 50, 25 and 10 % of the experts (trace and uniform routing, 2026-12-01/02), all
    within 10 %; experts on disk: 2026-11-29."""

    resident_s: float = 0.0325e-3  # every expert resident: one CUDA graph, run one pass ahead of the host
    # on top of these, a layer of latent attention (MLA: GLM-4.7-Flash, GLM-5): its latent kernels (latent_cache,
    # two head_products, a two-launch decode attention), 17 launches a layer in all. One fit: GLM-4.7-Flash (bf16)
    # fully resident at 182.5 tok/s (2026-12-04, 68.5 µs a layer in all); charged alike to offloaded placements and
    # to GLM-5, whose DSA attention costs more (not yet measured)
    latent_attention_s: float = 0.036e-3
    graph_s: float = 0.065e-3  # misses served on the device: one CUDA graph, each step waiting for its token
    segmented_s: float = 0.37e-3  # some experts on disk: a graph per layer around the host's expert work
    device_misses_s: float = 0.15e-3  # per MoE layer: resolving and fetching misses on the device


# The fetch kernel (app/kernels/expert_fetch.py) moves missed experts at about this share of the copy engine's
# rate: 49 against 54.6 GB/s between the 50 % runs of bench/results/decode-gpt-oss-20b-2026-12-01.json
FETCH_SHARE_OF_LINK = 0.9

# The expert cache's hit rate, by the share of a layer's experts it holds, on the real gpt-oss-20b routing under
# the engine's policy (bench/results/routing-curve-gpt-oss-20b-2026-12-01.json: 3,000 tokens of
# bench/data/gpt-oss-20b-routing.npz): a gpt_oss folder without its own routing.json is planned with it. Uniform
# routing stays the stated worst case (`predict_decode(..., worst_case=True)`).
KNOWN_ROUTING = {"gpt_oss": ("gpt-oss-20b's real routing",
                             ((0.05, 0.136), (0.1, 0.315), (0.25, 0.691), (0.5, 0.922), (0.75, 0.988)))}


@dataclass(frozen=True)
class Hardware:
    """The rates a decode step divides by; the defaults are an RTX 4090 on PCIe Gen4 x16. `cpu_experts`: the host's
    cores as a second expert tier beside the GPU (None: the CPU is the compute device, there is no second tier)."""

    link_bps: float = PCIE_BPS[4]  # host -> device copies of missed experts
    memory_bps: float = CARD_MEMORY_BPS["RTX 4090"]  # device memory bandwidth
    flops: float = 165e12  # dense bf16 tensor throughput
    disk_bps: float = 3e9  # experts past the RAM budget, read from the checkpoint (NVMe)
    overheads: LayerOverheads = LayerOverheads()
    cpu_experts: CpuExpertRates | None = HOST_CPU_EXPERTS


@dataclass(frozen=True)
class Prediction:
    """One decode token's cost: device time (weights read, or compute), expert copies and the engine's
    per-layer work around them. Copies can overlap the device work, so no overlap gives the low speed and
    full overlap the high one. With the CPU expert tier, `copy_s` is the misses' time: per layer, the slower of the
    device's fetches and the CPU's share."""

    hit_rate: float
    measured_routing: bool  # the hit rate comes from measured routing, not the uniform bound
    routing: str  # whose routing the hit rate comes from
    fetched_bytes_per_token: float  # missed experts copied to the device (not those the CPU computes)
    disk_bytes_per_token: float  # of those, read from disk first
    memory_s: float
    compute_s: float
    copy_s: float
    overhead_s: float  # launches and host work, per token
    cpu_experts_per_token: float = 0.0  # missed experts the CPU tier computes instead of fetching them

    @property
    def device_s(self) -> float:
        return max(self.memory_s, self.compute_s)

    @property
    def tok_s_low(self) -> float:
        return 1 / (self.device_s + self.copy_s + self.overhead_s)

    @property
    def tok_s_high(self) -> float:
        return 1 / (max(self.device_s, self.copy_s) + self.overhead_s)

    @property
    def bound(self) -> str:
        """What limits the speed: "PCIe" (or "disk"), "memory bandwidth", "compute" or "per-layer overhead"."""
        if self.overhead_s > max(self.copy_s, self.device_s):
            return "per-layer overhead"
        if self.copy_s > self.device_s:
            if self.cpu_experts_per_token:
                return "PCIe and the CPU"
            return "disk" if self.disk_bytes_per_token * 2 > self.fetched_bytes_per_token else "PCIe"
        return "memory bandwidth" if self.memory_s >= self.compute_s else "compute"

    def as_dict(self) -> dict:
        return {**self.__dict__, "tok_s_low": self.tok_s_low, "tok_s_high": self.tok_s_high, "bound": self.bound}


def expert_hit_rate(slots: int, total_experts: int, uses_per_token: int) -> float:
    """The expert cache's steady-state hit rate under LRU with uniform routing (the worst case: real
    routing repeats experts more). The token being computed keeps about half of its own `uses_per_token`
    fetches in the cache, so those slots serve no earlier token."""
    if slots >= total_experts:
        return 1.0
    reserved = uses_per_token / 2
    return min(max((slots - reserved) / (total_experts - reserved), 0.0), 1.0)


def measured_hit_rate(points: tuple[tuple[float, float], ...], share: float) -> float:
    """The hit rate at `share` of the experts cached, interpolated linearly between measured points
    (and nothing cached: 0, everything: 1)."""
    return interpolated([(0.0, 0.0), *points, (1.0, 1.0)], share)


def routing_curve(facts: ModelFacts) -> tuple[str, tuple[tuple[float, float], ...]]:
    """Whose measured routing plans this model and its (share cached, hit rate) points; no points: unknown."""
    if facts.measured_hit_rates:
        return "this model's measured routing", facts.measured_hit_rates
    return KNOWN_ROUTING.get(facts.model_type, ("uniform routing, the worst case", ()))


def predict_decode(facts: ModelFacts, placement: Placement, dtype_bytes: int, hardware: Hardware,
                   worst_case: bool = False, cpu_threads: int = 0) -> Prediction:
    """Batch-1 decode speed of the target: a roofline of device memory, compute and expert copies. The hit
    rate is from the model's measured routing where it is known (`routing_curve`), else (and with
    `worst_case`) the uniform-routing bound. `cpu_threads` cores compute part of each layer's misses where the
    CPU tier runs (`cpu_tier_idle`), as many as make the layer's misses take least; elsewhere they change nothing."""
    uses_per_token = facts.expert_bytes_per_token // facts.expert_bytes
    routing, points = routing_curve(facts)
    if points and not worst_case:
        hit_rate = measured_hit_rate(points, placement.expert_slots / facts.total_experts)
    else:
        routing = "uniform routing, the worst case"
        hit_rate = expert_hit_rate(placement.expert_slots, facts.total_experts, uses_per_token)
    fetched = facts.expert_bytes_per_token * (1 - hit_rate)
    from_disk = fetched * placement.disk_experts / facts.total_experts
    embedding = facts.vocab_size * facts.hidden_size  # looked up one row at a time, not read
    weights_read = facts.resident_bytes(dtype_bytes) - embedding * dtype_bytes + facts.expert_bytes_per_token
    multiply_adds = facts.resident_weights - embedding + uses_per_token * facts.expert_weights
    overheads = hardware.overheads
    link_bps = hardware.link_bps
    if placement.expert_slots >= facts.total_experts:
        overhead_s = facts.num_layers * overheads.resident_s
    elif placement.disk_experts:  # the host copies misses (engine: experts/cache.py)
        overhead_s = facts.num_layers * overheads.segmented_s
    else:  # misses served on the device
        overhead_s = facts.num_layers * overheads.graph_s + len(facts.moe_layers) * overheads.device_misses_s
        link_bps *= FETCH_SHARE_OF_LINK
    if facts.latent_attention:
        overhead_s += facts.num_layers * overheads.latent_attention_s
    copy_s = fetched / link_bps + from_disk / hardware.disk_bps
    cpu_experts = 0.0
    if cpu_threads and cpu_tier_idle(facts, placement, hardware) is None:
        # only the misses' time changes: a step with the tier is one graph, as without it
        rates, layers = hardware.cpu_experts, uses_per_token // facts.top_k
        costs = (facts.expert_bytes / link_bps, rates.call_s, rates.pair_s(cpu_threads, facts.expert_bytes))
        saved_s, computed = expected_share(facts.top_k, 1 - hit_rate, costs)
        copy_s -= layers * saved_s
        cpu_experts = layers * computed
        fetched -= cpu_experts * facts.expert_bytes
    return Prediction(
        hit_rate=hit_rate,
        measured_routing=not routing.startswith("uniform"),
        routing=routing,
        fetched_bytes_per_token=fetched,
        disk_bytes_per_token=from_disk,
        memory_s=weights_read / hardware.memory_bps,
        compute_s=2 * multiply_adds / hardware.flops,
        copy_s=copy_s,
        overhead_s=overhead_s,
        cpu_experts_per_token=cpu_experts,
    )
