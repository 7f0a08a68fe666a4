"""Expert kernels reading experts through an address table (expert_table.py), in Triton's interpreter: rows that
point into cache slots and rows that point elsewhere (as page-locked host memory is, on a GPU) give the
reference's result for the experts they point to."""

import warnings

import pytest
import torch

from app.kernels import glu_experts_triton, gpt_oss_experts_triton
from app.kernels.expert_table import _address_kernel, device_addresses, slot_table
from app.kernels.glu_experts import glu_experts_torch
from app.kernels.gpt_oss_experts import gpt_oss_experts_torch
from app.kernels.gpt_oss_experts_triton import LaunchConfig, Tiles, matrix_unit_config
from tests.kernels.poison import poisoned_allocations
from tests.kernels.test_glu_experts_triton import FORMATS
from tests.kernels.test_glu_experts_triton import random_arenas as random_glu_arenas
from tests.kernels.test_gpt_oss_experts import ALPHA, LIMIT, random_arenas, random_routing, relative_error

NUM_EXPERTS, NUM_SLOTS = 7, 4


def mixed_table(sources: dict[str, torch.Tensor], slots: dict[str, torch.Tensor],
                generator: torch.Generator) -> torch.Tensor:
    """Every expert e of `sources` [E, ...]: some copied into a slot of `slots` and read there, the others read
    from `sources` in place."""
    in_slot = torch.randperm(NUM_EXPERTS, generator=generator)[:NUM_SLOTS].tolist()
    slot_rows, rows = slot_table(slots), []
    for expert in range(NUM_EXPERTS):
        if expert in in_slot:
            slot = in_slot.index(expert)
            for name, tensor in slots.items():
                tensor[slot] = sources[name][expert]
            rows.append(slot_rows[slot])
        else:
            rows.append(torch.tensor(device_addresses([t[expert] for t in sources.values()], torch.device("cpu"))))
    return torch.stack(rows)


GPT_OSS_CASES = [
    (1, True, None, torch.float32),  # the CUDA-core products (one token)
    (1, True, None, torch.bfloat16),  # the float16-pair products (one token, the decode step's)
    (5, True, matrix_unit_config(20, True), torch.float32),  # the matrix units (prefill's, past 16 tokens)
    (5, False, None, torch.float32),
    (3, True, LaunchConfig(2, Tiles(64, 64), Tiles(32, 64), cuda_cores=True), torch.float32),
]


@pytest.mark.parametrize(("tokens", "mxfp4", "config", "dtype"), GPT_OSS_CASES,
                         ids=["cuda-cores", "half-pairs", "mxfp4", "bf16", "2-pairs"])
def test_gpt_oss_experts_read_where_the_table_points(tokens, mxfp4, config, dtype):
    generator = torch.Generator().manual_seed(tokens * 10 + mxfp4)
    sources = random_arenas(NUM_EXPERTS, mxfp4, generator)
    slots = {name: torch.zeros_like(t[:NUM_SLOTS]) for name, t in sources.items()}
    table = mixed_table(sources, slots, generator)
    rows, weights = random_routing(tokens, 4, NUM_EXPERTS, generator)
    hidden = torch.randn(tokens, sources["down_proj_bias"].shape[1], generator=generator).to(dtype)
    with poisoned_allocations(), warnings.catch_warnings():
        warnings.filterwarnings("ignore", "overflow encountered in exp")
        out = gpt_oss_experts_triton.run_from_table(hidden, slots, table, rows, weights.to(dtype), LIMIT, ALPHA,
                                                    config)
    ref = gpt_oss_experts_torch(hidden.float(), sources, rows, weights.to(dtype).float(), LIMIT, ALPHA)
    assert relative_error(out, ref) < {torch.float32: 1e-4 if mxfp4 else 1e-5, torch.bfloat16: 6e-3}[dtype]


@pytest.mark.parametrize("fmt", sorted(FORMATS))
def test_glu_experts_read_where_the_table_points(fmt):
    generator = torch.Generator().manual_seed(len(fmt))
    sources = random_glu_arenas(NUM_EXPERTS, fmt, generator)
    slots = {name: torch.zeros_like(t[:NUM_SLOTS]) for name, t in sources.items()}
    table = mixed_table(sources, slots, generator)
    rows, weights = random_routing(5, 4, NUM_EXPERTS, generator)
    hidden = torch.randn(5, sources["gate_proj.weight"].shape[2], generator=generator)
    with poisoned_allocations():
        out = glu_experts_triton.run_from_table(hidden, slots, table, rows, weights, FORMATS[fmt])
    ref = glu_experts_torch(hidden, sources, rows, weights, FORMATS[fmt])
    assert relative_error(out, ref) < 1e-4


def test_the_address_kernel_writes_each_tensors_pointer():
    """What `device_addresses` launches on a GPU (on a CPU it takes data_ptr() itself): here the interpreter's
    pointers are the tensors' own, so the kernel must write data_ptr()."""
    arena = torch.zeros(3, 4)
    tensors = [torch.zeros(5, dtype=torch.bfloat16), arena[1]]  # arena[1] starts 16 bytes into its buffer
    out = torch.full((len(tensors) + 1,), -1, dtype=torch.int64)
    for index, tensor in enumerate(tensors):
        _address_kernel[(1,)](tensor.view(torch.uint8), out[index:])
    assert out.tolist() == [t.data_ptr() for t in tensors] + [-1]  # and nothing past its own entry
