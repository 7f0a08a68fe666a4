"""Open a model folder, plan the placement, and build the model on the device exactly as planned."""

from collections.abc import Callable
from dataclasses import dataclass

import torch

from app.engine.experts.cache import ExpertCache
from app.engine.experts.cpu_tier import CpuTier, measured_fetch_s
from app.engine.experts.device_misses import DEVICE_PASS_MAX_TOKENS
from app.engine.experts.expert_parallel import ExpertParallelCache
from app.engine.experts.store import ExpertStore
from app.engine.layers.linear import keeps_fp8
from app.engine.models import ARCHITECTURES
from app.engine.weights.checkpoint import Checkpoint, check_finite
from app.errors import UserError
from app.kernels.choice import triton_runs
from app.kernels.expert_op import ExpertOp
from app.model_folder import ModelFolder
from app.plan import FETCH_SHARE_OF_LINK, PCIE_BPS, ModelFacts, Placement, dtype_bytes
from app.plan_gpus import plan_budgets

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}


@dataclass
class LoadedModel:
    folder: ModelFolder
    facts: ModelFacts
    placement: Placement
    model: object  # one of the ARCHITECTURES' model classes
    gpu_placements: tuple[Placement, ...] = ()  # one per GPU when the experts are spread over several

    @property
    def context(self) -> int:
        return self.placement.context


def resolve_device(name: str) -> torch.device:
    if name == "cuda" and not torch.cuda.is_available():
        raise UserError("--device cuda was asked for but no CUDA GPU is available; use --device cpu")
    if name not in ("cpu", "cuda"):
        raise UserError(f"unknown device '{name}': use cpu or cuda")
    return torch.device(name)


def expert_devices(device: torch.device, count: int) -> list[torch.device]:
    """The devices of an expert-parallel cache: the first `count` GPUs, or `count` arenas in RAM on the CPU
    (the same code path, so it runs in CI)."""
    if device.type == "cpu":
        return [device] * count
    if torch.cuda.device_count() < count:
        raise UserError(f"{count} GPU budgets were given but this machine has {torch.cuda.device_count()} CUDA "
                        "GPU(s): give one budget per GPU")
    return [torch.device("cuda", index) for index in range(count)]


def start_cpu_tier(store: ExpertStore, op: ExpertOp, facts: ModelFacts, threads: int, device: torch.device) -> CpuTier:
    if op.on_host is None:
        raise UserError("--cpu-threads needs the CPU expert kernels for this model's expert format, which this "
                        "install lacks (a C compiler when the package was installed); use --cpu-threads 0")
    fetch_s = (measured_fetch_s(store, device, FETCH_SHARE_OF_LINK) if device.type == "cuda"
               else store.expert_bytes / (PCIE_BPS[4] * FETCH_SHARE_OF_LINK))
    return CpuTier(store, op, facts.hidden_size, facts.top_k, DEVICE_PASS_MAX_TOKENS, threads, device, fetch_s)


def reads_store_in_place(device: torch.device, placement: Placement, facts: ModelFacts, store: ExpertStore) -> bool:
    """The CPU's kernels (C or torch) read every expert from the host store, no cache arena needed; Triton's
    interpreter keeps the arena its kernels' contiguous slots need."""
    complete = placement.expert_slots >= facts.total_experts and store.all_in_host_memory
    return device.type == "cpu" and not triton_runs(device) and complete


def load_model(
    folder: ModelFolder,
    device: str = "cpu",
    dtype: str = "bfloat16",
    gpu_budget: int | tuple[int, ...] | None = None,
    ram_budget: int | None = None,
    context: int = 4096,
    prefetch_layers: int = 0,
    on_progress: Callable[[str, float], None] = lambda stage, fraction: None,
    misses_on_device: bool = True,
    cpu_threads: int = 0,
) -> LoadedModel:
    """`on_progress(stage, fraction)` is called between stages and per layer of experts; raising
    from it cancels the load. A tuple of budgets, one per GPU, spreads the experts over the GPUs.
    Decode and verify passes have their misses served on the device where they can (experts/cache.py), unless
    `misses_on_device` is False (the host then copies them, waiting at each layer); there `cpu_threads` cores
    compute part of the misses (experts/cpu_tier.py; 0: none)."""
    torch_device = resolve_device(device)
    on_progress("planning", 0.0)
    facts = ModelFacts.from_folder(folder, fp8_kept=keeps_fp8(torch_device))
    placement, gpu_placements = plan_budgets(facts, gpu_budget, ram_budget, context, dtype_bytes(dtype))
    devices = expert_devices(torch_device, len(gpu_placements)) if gpu_placements else [torch_device]
    config_class, model_class, make_reader = ARCHITECTURES[folder.model_type]
    try:
        config = config_class.from_dict(folder.config)
    except KeyError as missing:
        raise UserError(f"config.json in '{folder.path}' lacks the key {missing}") from None
    checkpoint = Checkpoint(folder)
    check_finite(checkpoint)
    store = ExpertStore(
        make_reader(config, checkpoint),
        facts.moe_layers,
        facts.num_experts,
        placement.host_experts,
        pin=torch_device.type == "cuda",
        on_layer=lambda done: on_progress("expert store", done / len(facts.moe_layers)),
    )
    on_progress("expert cache", 0.0)
    device_misses = None
    if gpu_placements:
        cache = ExpertParallelCache(store, [p.expert_slots for p in gpu_placements], devices, prefetch_layers)
        cache.preload_owned()
    elif reads_store_in_place(torch_device, placement, facts, store):
        cache = ExpertCache.over_host_store(store, prefetch_layers)
    else:
        cache = ExpertCache(store, placement.expert_slots, torch_device, prefetch_layers)
        if placement.expert_slots >= facts.total_experts:
            cache.preload([(layer, e) for layer in facts.moe_layers for e in range(facts.num_experts)])
        elif misses_on_device and triton_runs(torch_device) and store.all_in_host_memory:
            cache.serve_misses_on_device(facts.top_k)
            device_misses = cache.device_misses
    on_progress("resident weights", 0.0)
    model = model_class(config, checkpoint, cache, DTYPES[dtype])
    if cpu_threads and device_misses is not None:
        on_progress("CPU expert tier", 0.0)
        device_misses.cpu_tier = start_cpu_tier(store, model.run_experts, facts, cpu_threads, torch_device)
    on_progress("ready", 1.0)
    return LoadedModel(folder, facts, placement, model, gpu_placements)
