import pytest
import torch

from app.engine.loader import load_model
from app.engine.spec.dflash import DFlashSpeculation
from app.model_folder import ModelFolder


@pytest.fixture(scope="package", autouse=True)
def one_thread():
    """Tiny models in many small steps: torch's intra-op threads cost more than they save, and far more
    when other processes share the cores."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="session")
def resident_target(tiny_gpt_oss):
    """The tiny target with every expert resident, float32 (shared: tests must not change it)."""
    return load_model(ModelFolder.open(tiny_gpt_oss), dtype="float32", context=128).model


@pytest.fixture(scope="session")
def offloaded_target(tiny_gpt_oss, resident_target):
    """The tiny target with 3 expert slots of 32 and look-ahead prefetch, float32."""
    return load_offloaded(tiny_gpt_oss, slots=3, prefetch_layers=2).model


@pytest.fixture(scope="session")
def speculation(tiny_dflash, offloaded_target):
    """The tiny drafter loaded next to the offloaded target (block size chosen per step)."""
    loaded = DFlashSpeculation(tiny_dflash, None)
    loaded.load(offloaded_target)
    return loaded


def load_offloaded(folder, slots: int, prefetch_layers: int):
    probe = load_model(ModelFolder.open(folder), dtype="float32", context=128)
    placement = probe.placement
    budget = placement.resident_bytes + placement.kv_cache_bytes + placement.workspace_bytes
    loaded = load_model(ModelFolder.open(folder), dtype="float32", context=128,
                        gpu_budget=budget + slots * placement.expert_bytes, prefetch_layers=prefetch_layers)
    assert loaded.placement.expert_slots == slots
    return loaded
