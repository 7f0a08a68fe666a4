"""The compiled Triton GPT-OSS experts on a GPU, at gpt-oss's widths, against the float32 torch reference;
both product paths (CUDA cores at decode and in verify blocks, matrix units beyond) and the op captured in a CUDA
graph. Skipped without a CUDA device (see conftest.py)."""

import pytest
import torch

from app.engine.experts.op_graph import SingleTokenGraph
from app.kernels.gpt_oss_experts import gpt_oss_experts, gpt_oss_experts_torch
from app.kernels.gpt_oss_experts_triton import LaunchConfig, Tiles, matrix_unit_config, pick_config, run_experts
from tests.kernels.poison import poisoned_allocations
from tests.kernels.test_gpt_oss_experts import ALPHA, LIMIT, random_arenas, random_routing, relative_error

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")

HIDDEN = WIDTH = 2880  # 90 groups of 32: the CUDA-core steps of 32 groups end on a masked tail
SLOTS, PICKS = 12, 4


def case(mxfp4: bool, tokens: int, seed: int):
    generator = torch.Generator().manual_seed(seed)
    arenas = {name: t.cuda() for name, t in random_arenas(SLOTS, mxfp4, generator, HIDDEN, WIDTH).items()}
    slots, weights = random_routing(tokens, PICKS, SLOTS, generator)
    hidden = torch.randn(tokens, HIDDEN, generator=generator)
    return hidden.cuda(), arenas, slots.cuda(), weights.cuda()


def experts(hidden, arenas, slots, weights, config: LaunchConfig | None = None) -> torch.Tensor:
    with poisoned_allocations():
        return run_experts(hidden, arenas, slots, weights, LIMIT, ALPHA, config)


def reference(hidden, arenas, slots, weights) -> torch.Tensor:
    return gpt_oss_experts_torch(hidden.float(), arenas, slots, weights.float(), LIMIT, ALPHA)


@pytest.mark.parametrize("tokens", [1, 4, 16, 100])  # decode, a short and a long verify block, a prefill chunk
@pytest.mark.parametrize("mxfp4", [True, False], ids=["mxfp4", "bf16"])
def test_bfloat16_kernel_matches_float32_reference(mxfp4, tokens):
    hidden, arenas, slots, weights = case(mxfp4, tokens, tokens + 1000 * mxfp4)
    out = experts(hidden.bfloat16(), arenas, slots, weights.bfloat16())
    assert out.dtype == torch.bfloat16 and out.isfinite().all()
    assert relative_error(out, reference(hidden.bfloat16(), arenas, slots, weights.bfloat16())) < 1e-2
    if tokens > 1:
        assert (out[1] == 0).all()


@pytest.mark.parametrize("tokens", [1, 16])
def test_float32_mxfp4_kernel_matches_float32_reference(tokens):
    hidden, arenas, slots, weights = case(True, tokens, tokens + 7)
    out = experts(hidden, arenas, slots, weights)
    assert relative_error(out, reference(hidden, arenas, slots, weights)) < 1e-4


# the CUDA-core configurations that bench/kernel_gpt_oss_experts.py sweeps, and the matrix units at decode
CUDA_CORE_SWEEP = [
    LaunchConfig(pairs, Tiles(gate_up_rows, 1024), Tiles(down_rows, 1024), cuda_cores=True)
    for pairs, gate_up_rows, down_rows in ((1, 16, 8), (1, 16, 16), (1, 16, 32), (1, 32, 16), (1, 32, 32), (2, 16, 8),
                                           (2, 32, 16), (4, 32, 16))
]


@pytest.mark.parametrize("config", [*CUDA_CORE_SWEEP, matrix_unit_config(16 * PICKS, True)], ids=repr)
def test_each_swept_config_matches_float32_reference(config):
    hidden, arenas, slots, weights = case(True, 16, 3)
    out = experts(hidden.bfloat16(), arenas, slots, weights.bfloat16(), config)
    assert relative_error(out, reference(hidden.bfloat16(), arenas, slots, weights.bfloat16())) < 1e-2


def test_single_token_graph_replays_the_cuda_core_op_for_new_routings():
    hidden, arenas, slots, weights = case(True, 1, 5)
    assert pick_config(slots.numel(), True).cuda_cores
    graph = SingleTokenGraph(
        lambda *args: gpt_oss_experts(*args, LIMIT, ALPHA), arenas, hidden.bfloat16(), slots, weights.bfloat16()
    )
    generator = torch.Generator().manual_seed(6)
    for _ in range(2):
        slots, weights = (t.cuda() for t in random_routing(1, PICKS, SLOTS, generator))
        hidden = torch.randn(1, HIDDEN, generator=generator).cuda()
        replayed = graph(hidden.bfloat16(), slots, weights.bfloat16()).clone()
        eager = gpt_oss_experts(hidden.bfloat16(), arenas, slots, weights.bfloat16(), LIMIT, ALPHA)
        assert torch.equal(replayed, eager)


@pytest.mark.parametrize(("rows", "warps"), [(2, 1), (4, 1), (8, 4), (16, 4), (64, 8)])
def test_one_token_in_half_pairs_matches_float32_reference(rows, warps):
    """The inline HFMA2 and LOP3 that the interpreter emulates, at 90 groups a row (two full steps and a tail)."""
    hidden, arenas, slots, weights = case(True, 1, rows + warps)
    config = LaunchConfig(1, Tiles(rows, 1024, warps), Tiles(rows, 1024, warps), cuda_cores=True, half_pairs=True)
    out = experts(hidden.bfloat16() * 3, arenas, slots, weights.bfloat16(), config)
    assert relative_error(out, reference(hidden.bfloat16() * 3, arenas, slots, weights.bfloat16())) < 6e-3
