"""The Triton FP8 linear kernel against its torch reference, in Triton's interpreter (see conftest.py)."""

import pytest
import torch

from app.engine.layers import linear as layers_linear
from app.kernels.expert_tiles import Tiles
from app.kernels.fp8_linear import epilogue_torch, fp8_linear, fp8_linear_torch, one_token_linear
from app.kernels.fp8_linear_triton import one_token_tiles, pick_tiles, run_one_token
from app.kernels.rows_times_vector_triton import RowTiles
from tests.fixtures.tiny_glm import dequantize_reference, quantize_fp8
from tests.kernels.poison import poisoned_allocations
from tests.kernels.test_gpt_oss_experts import relative_error

FORMATS = {"per-channel": None, "block128": (128, 128), "block32": (32, 32)}
PREFILL = (64, Tiles(128, 64), 1)


def random_fp8_linear(out: int, inputs: int, fmt: str, generator: torch.Generator):
    master = torch.randn(out, inputs, generator=generator) / inputs**0.5
    block = FORMATS[fmt]
    return quantize_fp8(master, list(block) if block else None)


# decode, a verify block and a prefill chunk; features and inputs that are not multiples of the tiles or of the
# scale blocks (partial blocks, K and feature tails); split-K forced in with tiles of 32 inputs
GRID = [
    (1, 40, 200, "per-channel", None),
    (1, 40, 200, "block128", None),
    (3, 72, 96, "block32", None),
    (16, 40, 200, "block128", (16, Tiles(32, 32), 3)),
    (5, 33, 160, "per-channel", (16, Tiles(16, 32), 4)),
    (40, 136, 80, "block32", PREFILL),
    (70, 50, 144, "per-channel", PREFILL),
]


@pytest.mark.parametrize(("tokens", "out", "inputs", "fmt", "tiles"), GRID)
def test_kernel_matches_reference(tokens, out, inputs, fmt, tiles):
    generator = torch.Generator().manual_seed(tokens * 1000 + out + inputs)
    weight, scale = random_fp8_linear(out, inputs, fmt, generator)
    x = torch.randn(tokens, inputs, generator=generator)
    with poisoned_allocations():
        y = fp8_linear(x, weight, scale, FORMATS[fmt], tiles)
    ref = fp8_linear_torch(x, weight, scale, FORMATS[fmt])
    assert y.shape == (tokens, out) and y.dtype == torch.float32
    assert relative_error(y, ref) < 1e-5


def test_reference_is_x_times_the_directly_dequantized_weight():
    generator = torch.Generator().manual_seed(3)
    for fmt, block in FORMATS.items():
        weight, scale = random_fp8_linear(72, 96, fmt, generator)
        x = torch.randn(4, 96, generator=generator)
        expected = x @ dequantize_reference(weight, scale, list(block) if block else None).T
        torch.testing.assert_close(fp8_linear_torch(x, weight, scale, block), expected)


def test_bfloat16_inputs_give_bfloat16_close_to_float32():
    generator = torch.Generator().manual_seed(7)
    weight, scale = random_fp8_linear(48, 160, "block32", generator)
    x = torch.randn(9, 160, generator=generator)
    with poisoned_allocations():
        y = fp8_linear(x.bfloat16(), weight, scale, (32, 32), (16, Tiles(16, 32), 2))
    assert y.dtype == torch.bfloat16
    assert relative_error(y, fp8_linear_torch(x, weight, scale, (32, 32))) < 1e-2


@pytest.mark.parametrize("fmt", ["per-channel", "block32"])
def test_bfloat16_prefill_takes_float16_inputs_saturated(fmt):
    """Where the weights are converted (no FP8 tensor cores), a prefill chunk converts bf16 x to float16 once: values
    past float16's range saturate, as in the products."""
    generator = torch.Generator().manual_seed(8)
    weight, scale = random_fp8_linear(40, 96, fmt, generator)
    x = torch.randn(20, 96, generator=generator).bfloat16()
    x[3, 5], x[11, 70] = 1e6, -3e5
    with poisoned_allocations():
        y = fp8_linear(x, weight, scale, FORMATS[fmt], PREFILL, fp8_products=False)
    assert y.dtype == torch.bfloat16
    expected = fp8_linear_torch(x.float().clamp(-65504.0, 65504.0), weight, scale, FORMATS[fmt])
    assert relative_error(y, expected) < 1e-2


@pytest.mark.parametrize("scale_factor", [1.0, 1e-3])
def test_float16_products_keep_small_block_scales(scale_factor):
    """FP8 weights with 16-bit inputs take float16 products, their block scales too (in the interpreter as on a
    GPU): a small scale (here about 4.6e-7, float16's subnormals) must not lose its bits."""
    generator = torch.Generator().manual_seed(9)
    weight, scale = random_fp8_linear(40, 256, "block32", generator)
    scale = scale * scale_factor
    x = torch.randn(20, 256, generator=generator).half()
    with poisoned_allocations():
        y = fp8_linear(x, weight, scale, (32, 32), PREFILL, fp8_products=False)
    assert y.dtype == torch.float16
    assert relative_error(y.float(), fp8_linear_torch(x.float(), weight, scale, (32, 32))) < 1e-3


def test_decode_splits_inputs_until_the_gpu_has_two_programs_per_sm():
    # GLM-4.5-Air's o_proj at decode: 4096 rows make 128 row tiles, 132 SMs want 264 programs: 3 splits
    assert pick_tiles(1, 4096, 12288, 132)[::2] == (16, 3)
    # k_proj: 32 row tiles would want 9 splits, but 4096 inputs are 32 steps and a split reads at least 4
    assert pick_tiles(1, 1024, 4096, 132)[2] == 8
    assert pick_tiles(1, 12288, 4096, 132)[2] == 1  # q_proj has 384 row tiles already
    assert pick_tiles(256, 1024, 4096, 132)[2] == 1  # prefill: no split


# one share and split-K; the GLU's halves not multiples of the finishing block
@pytest.mark.parametrize(("tokens", "out", "inputs", "fmt", "tiles"), [
    (1, 80, 200, "per-channel", None),
    (3, 64, 96, "block32", (16, Tiles(32, 32), 3)),
    (2, 72, 160, "per-channel", (16, Tiles(16, 32), 4)),
])
@pytest.mark.parametrize(("glu", "with_residual"), [(True, False), (False, True), (True, True)])
def test_epilogues_match_reference(tokens, out, inputs, fmt, tiles, glu, with_residual):
    generator = torch.Generator().manual_seed(tokens * 100 + out + glu)
    weight, scale = random_fp8_linear(out, inputs, fmt, generator)
    x = torch.randn(tokens, inputs, generator=generator)
    residual = torch.randn(tokens, out // 2 if glu else out, generator=generator) if with_residual else None
    with poisoned_allocations():
        y = fp8_linear(x, weight, scale, FORMATS[fmt], tiles, glu=glu, residual=residual)
    ref = fp8_linear_torch(x, weight, scale, FORMATS[fmt], glu=glu, residual=residual)
    assert y.shape == ref.shape == (tokens, out // 2 if glu else out)
    assert relative_error(y, ref) < 1e-5


# one token: rows per program and steps that leave tails, folds; block scales cut the rows (a GLU's up rows must share
# the gate rows' block row: 18 outputs of block128 leave 2 rows a program) and are read once a step (block128: steps
# of 64) or per input (block32: steps of 64 and 256)
@pytest.mark.parametrize(("out", "inputs", "fmt", "tiles"), [
    (40, 200, "per-channel", RowTiles(16, 64, warps=2)),
    (40, 200, "per-channel", RowTiles(4, 128, fold=16)),
    (72, 96, "block32", RowTiles(64, 64, fold=8)),
    (72, 300, "block32", RowTiles(8, 256)),
    (36, 160, "block128", RowTiles(8, 64, warps=1, fold=4)),
])
@pytest.mark.parametrize(("glu", "with_residual"), [(False, False), (True, True)])
def test_one_token_tiles_match_reference(out, inputs, fmt, tiles, glu, with_residual):
    generator = torch.Generator().manual_seed(out + inputs + glu)
    weight, scale = random_fp8_linear(out, inputs, fmt, generator)
    x = torch.randn(1, inputs, generator=generator)
    residual = torch.randn(1, out // 2 if glu else out, generator=generator) if with_residual else None
    with poisoned_allocations():
        y = run_one_token(x, weight, scale, FORMATS[fmt], glu, residual, tiles)
    ref = fp8_linear_torch(x, weight, scale, FORMATS[fmt], glu=glu, residual=residual)
    assert y.shape == ref.shape
    assert relative_error(y, ref) < 1e-5


# the same with bf16 inputs, as the engine decodes (the tests above take float32 ones, which a kernel may load in
# another layout): tails, block32 scales per input, block128 scales a step, two warps
@pytest.mark.parametrize(("out", "inputs", "fmt", "tiles"), [
    (40, 200, "per-channel", RowTiles(16, 64, warps=2)),
    (72, 300, "block32", RowTiles(8, 256, warps=2)),
    (36, 160, "block128", RowTiles(8, 64, warps=1, fold=4)),
    (16, 1040, "block32", RowTiles(4, 1024, warps=2, fold=16)),
])
@pytest.mark.parametrize(("glu", "with_residual"), [(False, False), (True, True)])
def test_one_token_of_bfloat16_inputs_matches_reference(out, inputs, fmt, tiles, glu, with_residual):
    generator = torch.Generator().manual_seed(out + inputs + glu)
    weight, scale = random_fp8_linear(out, inputs, fmt, generator)
    x = torch.randn(1, inputs, generator=generator).bfloat16()
    residual = torch.randn(1, out // 2 if glu else out, generator=generator).bfloat16() if with_residual else None
    with poisoned_allocations():
        y = run_one_token(x, weight, scale, FORMATS[fmt], glu, residual, tiles)
    ref = fp8_linear_torch(x.float(), weight, scale, FORMATS[fmt], glu=glu,
                           residual=None if residual is None else residual.float())
    assert y.dtype == torch.bfloat16 and y.shape == ref.shape
    assert relative_error(y, ref) < 1e-2  # bf16 output rounding alone is ~2e-3


# 16-bit weights at one token (`one_token_linear`: the SiLU-gated MLPs of bf16 GLM checkpoints), each dtype's
# default tiles and tails of rows and of steps
@pytest.mark.parametrize(("out", "inputs"), [(40, 200), (18, 600)])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize(("glu", "with_residual"), [(True, False), (False, True), (True, True)])
def test_one_token_linear_of_a_16_bit_weight_matches_reference(out, inputs, dtype, glu, with_residual):
    generator = torch.Generator().manual_seed(out + inputs + glu + 2 * with_residual)
    weight = (torch.randn(out, inputs, generator=generator) / inputs**0.5).to(dtype)
    x = torch.randn(1, inputs, generator=generator).to(dtype)
    residual = torch.randn(1, out // 2 if glu else out, generator=generator).to(dtype) if with_residual else None
    with poisoned_allocations():
        y = one_token_linear(x, weight, glu, residual)
    ref = epilogue_torch(x.float() @ weight.float().T, glu, None if residual is None else residual.float())
    assert y.dtype == dtype and y.shape == ref.shape
    assert relative_error(y.float(), ref) < (1e-5 if dtype == torch.float32 else 1e-2)


def test_one_token_tiles_leave_a_launch_a_thousand_warps_a_byte_of_weight():
    """GLM-4.5-Air's FP8 dense products keep the swept tiles; narrower outputs get fewer rows a program (gpt-oss-20b's
    o_proj, 2880 rows of 4096 bf16 inputs: 360 programs of 8 rows)."""
    assert one_token_tiles(4096, False, 1, 14336).rows == 8  # q/k/v
    assert one_token_tiles(12288, False, 1, 4096).rows == 4  # o
    assert one_token_tiles(4096, True, 1, 1408) == one_token_tiles(4096, True)  # the shared expert's gate + up
    assert one_token_tiles(2880, False, 2, 5120).rows == 2  # gpt-oss-20b's bf16 q/k/v: 2048 warps for 2 bytes
    assert one_token_tiles(4096, False, 2, 2880).rows == 1  # and o
    assert one_token_tiles(64, False, 2, 10).rows == 1


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_one_token_product_with_a_bias_takes_one_launch(dtype, monkeypatch):
    """linear's one token of an unscaled weight with a bias alone (gpt-oss's q/k/v and o) adds the bias in the
    product's launch, as a residual row; more tokens, or a bias with other epilogues, take F.linear."""
    generator = torch.Generator().manual_seed(7)
    weight = (torch.randn(40, 200, generator=generator) / 200**0.5).to(dtype)
    bias = torch.randn(40, generator=generator).to(dtype)
    launches = []

    def counted(*args, **kwargs):
        launches.append(args[0].shape)
        return one_token_linear(*args, **kwargs)

    monkeypatch.setattr(layers_linear, "one_token_linear", counted)
    for tokens in (1, 3):
        x = torch.randn(tokens, 200, generator=generator).to(dtype)
        with poisoned_allocations():
            y = layers_linear.linear(x, weight, bias)
        ref = x.float() @ weight.float().T + bias.float()
        assert y.dtype == dtype and y.shape == ref.shape
        assert relative_error(y.float(), ref) < (1e-5 if dtype == torch.float32 else 1e-2)
    assert launches == [(1, 200)]
