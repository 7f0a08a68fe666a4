"""The Triton GPT-OSS experts against the torch reference, in Triton's interpreter (see conftest.py)."""

import warnings

import pytest
import torch

from app.kernels import gpt_oss_experts_triton
from app.kernels.gpt_oss_experts import (
    gpt_oss_experts,
    gpt_oss_experts_op,
    gpt_oss_experts_torch,
    takes_hidden_pairs,
)
from app.kernels.gpt_oss_experts_triton import (
    HALF_PAIRS_DOWN_ROWS,
    HALF_PAIRS_ROWS,
    LaunchConfig,
    Tiles,
    half_pairs_config,
    pick_config,
)
from app.kernels.mxfp4_half_pairs import half_pairs
from app.kernels.pick_rows import PickRows
from tests.kernels.poison import poisoned_allocations

HIDDEN, WIDTH = 96, 96  # multiples of 32 (MXFP4 groups) that leave K tails for the dense 64- and 128-wide steps
LIMIT, ALPHA = 7.0, 1.702
# wider tiles than the default: 32 pairs per tile (prefill) and a feature tail (2 * WIDTH % 128); the grid runs
# them with a hidden size of 128, so that MXFP4 gate_up steps take two groups (the default shape has dense
# feature tails: HIDDEN % 64)
WIDE = LaunchConfig(32, Tiles(128, 64), Tiles(64, 128))


def random_arenas(
    num_slots: int, mxfp4: bool, generator: torch.Generator, hidden: int = HIDDEN, width: int = WIDTH
) -> dict[str, torch.Tensor]:
    def normal(*shape, std=1.0):
        return (torch.randn(shape, generator=generator) * std).to(torch.bfloat16)

    def uint8(low, high, *shape):
        return torch.randint(low, high, shape, generator=generator, dtype=torch.uint8)

    arenas = {"gate_up_proj_bias": normal(num_slots, 2 * width), "down_proj_bias": normal(num_slots, hidden)}
    if mxfp4:
        # scales 2^-8 .. 2^-3 keep the products of random e2m1 values in SwiGLU's interesting range
        arenas |= {
            "gate_up_proj_blocks": uint8(0, 256, num_slots, 2 * width, hidden // 32, 16),
            "gate_up_proj_scales": uint8(119, 125, num_slots, 2 * width, hidden // 32),
            "down_proj_blocks": uint8(0, 256, num_slots, hidden, width // 32, 16),
            "down_proj_scales": uint8(119, 125, num_slots, hidden, width // 32),
        }
    else:
        arenas |= {
            "gate_up_proj": normal(num_slots, hidden, 2 * width, std=hidden**-0.5),
            "down_proj": normal(num_slots, width, hidden, std=width**-0.5),
        }
    return arenas


def random_routing(tokens: int, picks: int, num_slots: int, generator: torch.Generator):
    """slots [T, k] (distinct per token; about a fifth -1, but not token 0's first; all of token 1's),
    weights [T, k]."""
    slots = torch.stack([torch.randperm(num_slots, generator=generator)[:picks] for _ in range(tokens)])
    first = slots[0, 0].item()
    slots[torch.rand(slots.shape, generator=generator) < 0.2] = -1
    slots[0, 0] = first
    if tokens > 1:
        slots[1] = -1
    weights = torch.softmax(torch.randn(tokens, picks, generator=generator), dim=-1)
    return slots, weights


def run_kernel(*args, config: LaunchConfig | None = None) -> torch.Tensor:
    with poisoned_allocations(), warnings.catch_warnings():
        warnings.filterwarnings("ignore", "overflow encountered in exp")  # numpy's sigmoid of large -x
        if config is None:
            return gpt_oss_experts(*args, LIMIT, ALPHA)
        return gpt_oss_experts_triton.run_experts(*args, LIMIT, ALPHA, config)


def relative_error(out: torch.Tensor, ref: torch.Tensor) -> float:
    return ((out.double() - ref.double()).norm() / ref.double().norm()).item()


# a wider expert (5 groups a down row) with down's 64-row tiles on a feature tail (H = 96)
WIDER = 160
DOWN_TAIL = LaunchConfig(16, Tiles(64, 64), Tiles(64, 64))
GRID = [
    (tokens, picks, num_slots, mxfp4, None, HIDDEN, WIDTH)
    for tokens in (1, 5, 16, 40) for picks in (2, 4) for num_slots in (4, 9) for mxfp4 in (True, False)
] + [(tokens, 4, 9, mxfp4, WIDE, 128, WIDTH) for tokens in (5, 40) for mxfp4 in (True, False)] + [
    (tokens, 4, 9, mxfp4, config, HIDDEN, WIDER)
    for tokens, config in ((1, None), (5, DOWN_TAIL), (40, None)) for mxfp4 in (True, False)
]


@pytest.mark.parametrize(("tokens", "picks", "num_slots", "mxfp4", "config", "hidden_size", "width"), GRID)
def test_kernel_matches_reference(tokens, picks, num_slots, mxfp4, config, hidden_size, width):
    seed = tokens * 1000 + picks * 100 + num_slots * 10 + 2 * mxfp4 + (config is WIDE) + width
    generator = torch.Generator().manual_seed(seed)
    arenas = random_arenas(num_slots, mxfp4, generator, hidden_size, width)
    slots, weights = random_routing(tokens, picks, num_slots, generator)
    hidden = torch.randn(tokens, hidden_size, generator=generator)
    out = run_kernel(hidden, arenas, slots, weights, config=config)
    ref = gpt_oss_experts_torch(hidden, arenas, slots, weights, LIMIT, ALPHA)
    assert out.shape == ref.shape and out.dtype == hidden.dtype
    assert not out.isnan().any()
    # float32 activations reach tl.dot_scaled as two bf16 parts: about 16 bits of mantissa
    assert relative_error(out, ref) < (1e-4 if mxfp4 else 1e-5)
    if tokens > 1:
        assert (out[1] == 0).all()  # all its picks skipped


@pytest.mark.parametrize("mxfp4", [True, False], ids=["mxfp4", "bf16"])
def test_bfloat16_hidden_matches_float32_reference(mxfp4):
    generator = torch.Generator().manual_seed(11)
    arenas = random_arenas(6, mxfp4, generator)
    slots, weights = random_routing(12, 4, 6, generator)
    hidden = torch.randn(12, HIDDEN, generator=generator).to(torch.bfloat16)
    out = run_kernel(hidden, arenas, slots, weights.to(torch.bfloat16))
    ref = gpt_oss_experts_torch(hidden.float(), arenas, slots, weights, LIMIT, ALPHA)
    assert out.dtype == torch.bfloat16
    assert relative_error(out, ref) < 2e-2


# MXFP4 products on CUDA cores at a hidden size of 160 (5 groups): 1, 2 and 4 pairs per tile; steps of 2 groups
# end on a masked group (K = 160 and 96), blocks of 64 and 128 rows on a row tail (160 and 192 rows); the
# default's steps of 32 groups run in the grid above
CUDA_CORES_HIDDEN = 160
CUDA_CORES = [
    (LaunchConfig(1, Tiles(64, 64), Tiles(32, 1024), cuda_cores=True), torch.float32),
    (LaunchConfig(2, Tiles(64, 1024), Tiles(64, 64), cuda_cores=True), torch.bfloat16),
    (LaunchConfig(4, Tiles(128, 64), Tiles(32, 64, warps=2), cuda_cores=True), torch.float32),
]


@pytest.mark.parametrize(("config", "dtype"), CUDA_CORES, ids=["1-pair-f32", "2-pairs-bf16", "4-pairs-f32"])
def test_cuda_core_products_match_reference(config, dtype):
    """3 tokens x 4 picks of 5 slots: tiles of several pairs, a slot's pairs split over tiles, skipped picks."""
    generator = torch.Generator().manual_seed(config.pairs_per_tile * 10 + (dtype is torch.float32))
    arenas = random_arenas(5, True, generator, CUDA_CORES_HIDDEN)
    slots, weights = random_routing(3, 4, 5, generator)
    hidden = torch.randn(3, CUDA_CORES_HIDDEN, generator=generator)
    out = run_kernel(hidden.to(dtype), arenas, slots, weights.to(dtype), config=config)
    ref = gpt_oss_experts_torch(hidden.to(dtype).float(), arenas, slots, weights.to(dtype).float(), LIMIT, ALPHA)
    assert out.dtype == dtype
    assert relative_error(out, ref) < (1e-5 if dtype is torch.float32 else 2e-2)
    assert (out[1] == 0).all()


# float16 pairs (mxfp4_half_pairs.py) at 3, 5 and 33 groups a row (a masked step; a full one and a tail), two tokens
# of two picks, and rows per program that leave row tails (2W = 192 rows at 128, H = 160 at 64)
ROW_TAILS = LaunchConfig(1, Tiles(128, 1024), Tiles(64, 1024, warps=2), cuda_cores=True, half_pairs=True)
# the model's own paths, at shapes the interpreter runs in seconds: gpt-oss's 2880 inputs (90 groups: two full steps
# and a masked third) on the GPU's rows of gate_up and of down, and 4096 inputs (128 groups: four full steps) at rows
# that divide N, the loads without masks
HALF_PAIRS = [(96, 96, 1, 4, None), (160, 96, 1, 4, None), (1056, 96, 1, 4, ROW_TAILS), (96, 96, 2, 2, None),
              (160, 96, 1, 4, ROW_TAILS), (96, 96, 1, 4, half_pairs_config(HALF_PAIRS_ROWS, HALF_PAIRS_DOWN_ROWS)),
              (2880, 32, 1, 3, half_pairs_config(HALF_PAIRS_ROWS, 128)),
              (32, 2880, 1, 3, half_pairs_config(128, HALF_PAIRS_DOWN_ROWS)),
              (64, 4096, 1, 3, half_pairs_config(256, 2))]


@pytest.mark.parametrize(("hidden_size", "width", "tokens", "picks", "config"), HALF_PAIRS,
                         ids=["3-groups", "5-groups", "33-groups", "2-tokens", "row-tails", "gpu-rows",
                              "2880-inputs", "2880-down-inputs", "4096-inputs"])
def test_bfloat16_decode_in_half_pairs_matches_float32_reference(hidden_size, width, tokens, picks, config):
    """The decode default (one pair per program, float16 pairs) with a skipped pick."""
    generator = torch.Generator().manual_seed(hidden_size + tokens)
    arenas = random_arenas(5, True, generator, hidden_size, width)
    slots, weights = random_routing(tokens, picks, 5, generator)
    slots[0, 1] = -1
    hidden = (torch.randn(tokens, hidden_size, generator=generator) * 3).to(torch.bfloat16)
    assert pick_config(tokens * picks, mxfp4=True).half_pairs
    out = run_kernel(hidden, arenas, slots, weights.to(torch.bfloat16), config=config)
    ref = gpt_oss_experts_torch(hidden.float(), arenas, slots, weights.to(torch.bfloat16).float(), LIMIT, ALPHA)
    assert out.dtype == torch.bfloat16
    assert relative_error(out, ref) < 6e-3  # bf16 output rounding alone is ~2e-3
    if tokens > 1:
        assert (out[1] == 0).all()  # all its picks skipped


def test_hidden_in_half_pairs_from_before_is_what_the_op_reads():
    """The pairs the norm hands the op (norms.add_rms_norm_half_pairs: `half_pairs` of its output) are its inputs:
    given another hidden's, it gives that hidden's result, bit for bit, as its picks' rows for the next norm to add
    (pick_rows.py)."""
    generator = torch.Generator().manual_seed(5)
    arenas = random_arenas(5, True, generator)
    slots, weights = random_routing(1, 4, 5, generator)
    hidden, other = ((torch.randn(1, HIDDEN, generator=generator) * 3).bfloat16() for _ in range(2))
    weights = weights.bfloat16()
    assert takes_hidden_pairs(slots.numel(), hidden.dtype, arenas)
    picks = gpt_oss_experts(hidden, arenas, slots, weights, LIMIT, ALPHA, hidden_pairs=half_pairs(other))
    assert isinstance(picks, PickRows) and torch.equal(picks.slots, slots)
    out = picks.total(hidden.dtype)
    assert torch.equal(out, gpt_oss_experts(other, arenas, slots, weights, LIMIT, ALPHA))
    assert not torch.equal(out, gpt_oss_experts(hidden, arenas, slots, weights, LIMIT, ALPHA))


def test_only_the_float16_pair_programs_take_hidden_in_half_pairs():
    generator = torch.Generator().manual_seed(6)
    mxfp4, dense = random_arenas(2, True, generator), random_arenas(2, False, generator)
    assert takes_hidden_pairs(4, torch.bfloat16, mxfp4)
    assert not takes_hidden_pairs(4, torch.float32, mxfp4)  # float32 products
    assert takes_hidden_pairs(64, torch.bfloat16, mxfp4)  # a verify block of 16 tokens
    assert not takes_hidden_pairs(65, torch.bfloat16, mxfp4)  # the matrix units
    assert not takes_hidden_pairs(4, torch.bfloat16, dense)


def test_half_pairs_scale_by_a_power_of_two_into_pair_order():
    x = torch.randn(2, 64) * torch.tensor([[1e-3], [300.0]])
    pairs, unscale = half_pairs(x)
    # input 32 g + 8 w + p + 4 h (of 2 groups) sits at 16 w + 8 g + 2 p + h: word w's 4 pairs (p, p + 4) of every
    # group together, then word w + 1's
    order = torch.arange(64).view(2, 4, 2, 4).permute(1, 0, 3, 2).flatten()
    restored = pairs.float()[:, torch.argsort(order)] * unscale[:, None] * 2.0**-14
    torch.testing.assert_close(restored, x, rtol=2**-11, atol=0)
    assert (pairs.float().abs().amax(dim=1) < 2**14).all() and (pairs.float().abs().amax(dim=1) >= 2**13).all()


def test_up_to_a_verify_block_of_16_tokens_takes_the_cuda_core_products_and_more_the_matrix_units():
    assert pick_config(1 * 4, mxfp4=True).half_pairs and pick_config(16 * 4, mxfp4=True).half_pairs
    assert not pick_config(17 * 4, mxfp4=True).cuda_cores and not pick_config(4, mxfp4=False).cuda_cores


def test_long_inputs_run_in_chunks_of_pairs(monkeypatch):
    generator = torch.Generator().manual_seed(5)
    arenas = random_arenas(5, True, generator)
    slots, weights = random_routing(5, 2, 5, generator)
    hidden = torch.randn(5, HIDDEN, generator=generator)
    monkeypatch.setattr(gpt_oss_experts_triton, "MAX_PAIRS", 4)  # 2 tokens per launch
    out = run_kernel(hidden, arenas, slots, weights)
    ref = gpt_oss_experts_torch(hidden, arenas, slots, weights, LIMIT, ALPHA)
    assert relative_error(out, ref) < 1e-4


def test_op_is_the_kernel_on_cuda_and_when_interpreting(monkeypatch):
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    assert gpt_oss_experts_op(torch.device("cuda")) is gpt_oss_experts
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    assert gpt_oss_experts_op(torch.device("cpu")) is gpt_oss_experts
