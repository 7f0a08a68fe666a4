"""Passes whose misses the device serves (app/engine/experts/device_misses.py), run in Triton's interpreter: the greedy
tokens and logits of the host-copy path (and of every expert resident), for single tokens, verify blocks and
batched decode, GPT-OSS and GLM in FP8; the host's view of the slots stays the device's, and the host counts
every hit and miss."""

import pytest
import torch

from app.engine.loader import load_model
from app.model_folder import ModelFolder
from tests.engine.greedy import greedy_with_stats
from tests.fixtures.tiny_glm import write_tiny_glm

PROMPT = list(range(40, 58))  # longer than a pass that reads in place: its misses are copied first
NEW = 8


def loaded(folder, slots: int | None, on_device: bool = True):
    probe = load_model(ModelFolder.open(folder), dtype="float32", context=64).placement
    budget = None if slots is None else (probe.resident_bytes + probe.kv_cache_bytes + probe.workspace_bytes
                                         + slots * probe.expert_bytes)
    return load_model(ModelFolder.open(folder), dtype="float32", context=64, gpu_budget=budget,
                      misses_on_device=on_device)


def check_residency(experts) -> None:
    """The device's slot table, its owners and the host's view of them agree."""
    r = experts.device_misses.residency
    columns = r.slot_of.shape[1]
    device = {divmod(int(flat), columns): slot for slot, flat in enumerate(r.owner.tolist()) if flat >= 0}
    assert device == experts.slot_of
    for (layer, expert), slot in device.items():
        assert r.slot_of[layer, expert] == slot
    assert int((r.slot_of >= 0).sum()) == len(device)


@pytest.fixture(scope="module")
def tiny_glm_fp8(tmp_path_factory):
    return write_tiny_glm(tmp_path_factory.mktemp("glm-fp8"), "glm4_moe_fp8", mtp=False)


@pytest.mark.parametrize("name", ["gpt_oss", "glm"])
def test_greedy_decode_gives_the_tokens_of_the_host_copy_path(name, tiny_gpt_oss, tiny_glm_fp8):
    folder = tiny_gpt_oss if name == "gpt_oss" else tiny_glm_fp8
    on_device = loaded(folder, 3)
    assert on_device.model.experts.device_misses is not None and on_device.model.experts.host_free_passes
    tokens, stats = greedy_with_stats(on_device, PROMPT, NEW)
    expected, expected_stats = greedy_with_stats(loaded(folder, 3, on_device=False), PROMPT, NEW)
    assert tokens == expected and len(set(tokens)) > 3
    work, expected_work = stats.expert_cache, expected_stats.expert_cache
    assert work.hits + work.misses == expected_work.hits + expected_work.misses  # every use counted
    assert work.misses > NEW and work.evictions > 0  # the cache is too small for the routing
    assert work.bytes_fetched == work.misses * on_device.facts.expert_bytes
    check_residency(on_device.model.experts)


def test_verify_blocks_and_batched_decode_give_the_logits_of_every_expert_resident(tiny_gpt_oss):
    on_device, resident = loaded(tiny_gpt_oss, 3), loaded(tiny_gpt_oss, None)
    assert resident.model.experts.complete
    with torch.inference_mode():
        for model in (on_device.model, resident.model):
            model.caches = [model.new_kv_cache(32) for _ in range(2)]
            for cache, offset in zip(model.caches, (0, 3), strict=True):
                model.forward(torch.tensor(PROMPT[offset:]), cache)
        block = torch.tensor([7, 8, 9, 10, 11])  # a verify block: passes of up to 16 tokens read in place
        got = on_device.model.forward(block, on_device.model.caches[0])
        want = resident.model.forward(block, resident.model.caches[0])
        on_device.model.experts.settle()
        assert (got - want).abs().max() <= 1e-4 * want.abs().max()
        tokens = torch.tensor([3, 4])
        got = on_device.model.forward_batch(list(tokens[:, None]), on_device.model.caches)
        want = resident.model.forward_batch(list(tokens[:, None]), resident.model.caches)
        on_device.model.experts.settle()
    assert (got - want).abs().max() <= 1e-4 * want.abs().max()
    check_residency(on_device.model.experts)
