"""Offloaded decode with misses served by the device on a GPU (device_misses.py): each step is one CUDA graph, its
greedy tokens are transformers', the CPU engine's and the host-copy path's (device memory within the budget is the
benchmark's check, at real sizes). Skipped without a CUDA device; on the GPU machine:
`python -m pytest tests/engine/test_device_misses_cuda.py`."""

import pytest
import torch

from app.engine.loader import load_model
from app.engine.runner.cuda_graph import DecodeGraph
from app.engine.runner.step_runner import StepRunner
from app.model_folder import ModelFolder
from tests.engine.greedy import greedy_with_stats, reference_greedy
from tools.demo.target import load_target

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")

PROMPT = list(range(40, 60))
NEW = 24


def offloaded(folder, slots: int, on_device: bool = True, cpu_threads: int = 0, probe_on: str = "cpu"):
    """The model with `slots` expert slots on the GPU, its sizes as a load on `probe_on` plans them (a GPU load can
    plan a model fully resident where a CPU probe's budget would not)."""
    probe = load_model(ModelFolder.open(folder), device=probe_on, dtype="float32", context=64).placement
    budget = probe.resident_bytes + probe.kv_cache_bytes + probe.workspace_bytes + slots * probe.expert_bytes
    loaded = load_model(ModelFolder.open(folder), device="cuda", dtype="float32", context=64, gpu_budget=budget,
                        misses_on_device=on_device, cpu_threads=cpu_threads)
    return loaded


def test_device_served_decode_is_one_graph_and_gives_the_tokens_of_every_other_path(tiny_gpt_oss):
    loaded = offloaded(tiny_gpt_oss, 5)
    experts = loaded.model.experts
    assert experts.device_misses is not None and not experts.complete
    with torch.inference_mode():
        assert isinstance(StepRunner(loaded.model, 64).program(1), DecodeGraph)
    tokens, stats = greedy_with_stats(loaded, PROMPT, NEW)
    work = stats.expert_cache
    assert work.misses > NEW and work.evictions > 0 and work.prefetches == 0
    copied, _ = greedy_with_stats(offloaded(tiny_gpt_oss, 5, on_device=False), PROMPT, NEW)
    cpu, _ = greedy_with_stats(load_model(ModelFolder.open(tiny_gpt_oss), dtype="float32", context=64), PROMPT, NEW)
    reference = reference_greedy(load_target(tiny_gpt_oss, torch.device("cpu")), PROMPT, NEW)
    assert tokens == copied == cpu == reference


def test_the_host_view_follows_the_device_after_graph_steps(tiny_gpt_oss):
    loaded = offloaded(tiny_gpt_oss, 5)
    greedy_with_stats(loaded, PROMPT, NEW)
    experts = loaded.model.experts
    r = experts.device_misses.residency
    columns = r.slot_of.shape[1]
    device = {divmod(int(flat), columns): slot for slot, flat in enumerate(r.owner.tolist()) if flat >= 0}
    assert device == experts.slot_of and len(device) == experts.num_slots
