"""The Triton SiLU-gated experts against the torch reference, in Triton's interpreter (see conftest.py)."""

import pytest
import torch

from app.kernels import glu_experts_triton
from app.kernels.expert_table import columns, slot_table
from app.kernels.glu_experts import glu_experts, glu_experts_op, glu_experts_torch
from app.kernels.glu_experts_one_token import run_one_token
from app.kernels.glu_experts_triton import LaunchConfig, Projection, Tiles
from app.kernels.rows_times_vector_triton import RowTiles
from tests.fixtures.tiny_glm import quantize_fp8
from tests.kernels.poison import poisoned_allocations
from tests.kernels.test_gpt_oss_experts import random_routing, relative_error

HIDDEN, WIDTH = 80, 56  # not multiples of 32 (nor of 128): partial scale blocks, K and feature tails
FORMATS = {"bf16": None, "per-channel": None, "block128": (128, 128), "block32": (32, 32)}
# 32 pairs per tile (prefill), wider feature tiles and 64-input steps (block32 cuts them to 32)
WIDE = LaunchConfig(32, Tiles(64, 64), Tiles(64, 64))


def random_arenas(
    num_slots: int, fmt: str, generator: torch.Generator, hidden: int = HIDDEN, width: int = WIDTH
) -> dict[str, torch.Tensor]:
    """The arenas as the cache holds them: bf16 weights, or FP8 with per-channel or block scales."""
    arenas = {}
    shapes = {"gate_proj": (width, hidden), "up_proj": (width, hidden), "down_proj": (hidden, width)}
    for name, (out, inputs) in shapes.items():
        masters = [torch.randn(out, inputs, generator=generator) / inputs**0.5 for _ in range(num_slots)]
        if fmt == "bf16":
            arenas[f"{name}.weight"] = torch.stack(masters).to(torch.bfloat16)
            continue
        block = FORMATS[fmt]
        stored = [quantize_fp8(master, list(block) if block else None) for master in masters]
        arenas[f"{name}.weight"] = torch.stack([weight for weight, _ in stored])
        arenas[f"{name}.weight_scale_inv" if block else f"{name}.weight_scale"] = torch.stack([s for _, s in stored])
    return arenas


def run_kernel(*args, fp8_block=None, config: LaunchConfig | None = None) -> torch.Tensor:
    with poisoned_allocations():
        if config is None:
            return glu_experts(*args, fp8_block=fp8_block)
        return glu_experts_triton.run_experts(*args, fp8_block, config)


# decode and tiny steps in every format; a verify block and prefill chunks in two formats each (the
# interpreter takes about a second per case)
GRID = [
    *((tokens, picks, num_slots, fmt, None) for tokens, picks, num_slots in ((1, 4, 9), (3, 2, 4)) for fmt in FORMATS),
    *((16, 4, 6, fmt, None) for fmt in ("bf16", "per-channel")),
    *((40, 3, 5, fmt, None) for fmt in ("block128", "block32")),
    (40, 4, 9, "block32", WIDE),
]


@pytest.mark.parametrize(("tokens", "picks", "num_slots", "fmt", "config"), GRID)
def test_kernel_matches_reference(tokens, picks, num_slots, fmt, config):
    generator = torch.Generator().manual_seed(tokens * 100 + picks * 10 + num_slots + (config is WIDE))
    arenas = random_arenas(num_slots, fmt, generator)
    slots, weights = random_routing(tokens, picks, num_slots, generator)
    hidden = torch.randn(tokens, HIDDEN, generator=generator)
    out = run_kernel(hidden, arenas, slots, weights, fp8_block=FORMATS[fmt], config=config)
    ref = glu_experts_torch(hidden, arenas, slots, weights, fp8_block=FORMATS[fmt])
    assert out.shape == ref.shape and out.dtype == hidden.dtype
    assert not out.isnan().any()
    assert relative_error(out, ref) < 1e-5
    if tokens > 1:
        assert (out[1] == 0).all()  # all its picks skipped


# one token's picks, rows times one vector: tails, folds, block scales read once a step or per input, and 16-bit
# weights, which the op sends to the tiles
@pytest.mark.parametrize(("fmt", "tiles"), [
    ("bf16", RowTiles(8, 32, fold=4)),
    ("per-channel", RowTiles(16, 64, warps=2, fold=16)),
    ("block32", RowTiles(8, 16)),
    ("block128", RowTiles(4, 64, fold=2)),
])
def test_one_token_tiles_match_reference(fmt, tiles):
    generator = torch.Generator().manual_seed(len(fmt) + tiles.rows)
    arenas = random_arenas(7, fmt, generator)
    slots, weights = random_routing(1, 5, 7, generator)
    hidden = torch.randn(1, HIDDEN, generator=generator)
    projections = tuple(Projection.of(arenas, name, FORMATS[fmt]) for name in ("gate_proj", "up_proj", "down_proj"))
    with poisoned_allocations():
        out = run_one_token(hidden, projections, slot_table(arenas), slots, weights, columns(arenas), (tiles, tiles))
    ref = glu_experts_torch(hidden, arenas, slots, weights, fp8_block=FORMATS[fmt])
    assert relative_error(out, ref) < 1e-5


def test_bfloat16_hidden_matches_float32_reference():
    fmt = "block128"  # the interpreter's bf16 conversions; bf16 weights are covered on the GPU
    generator = torch.Generator().manual_seed(11)
    arenas = random_arenas(6, fmt, generator)
    slots, weights = random_routing(12, 4, 6, generator)
    hidden = torch.randn(12, HIDDEN, generator=generator).to(torch.bfloat16)
    out = run_kernel(hidden, arenas, slots, weights.to(torch.bfloat16), fp8_block=FORMATS[fmt])
    ref = glu_experts_torch(hidden.float(), arenas, slots, weights, fp8_block=FORMATS[fmt])
    assert out.dtype == torch.bfloat16
    assert relative_error(out, ref) < 2e-2


def test_long_inputs_run_in_chunks_of_pairs(monkeypatch):
    generator = torch.Generator().manual_seed(5)
    arenas = random_arenas(5, "per-channel", generator)
    slots, weights = random_routing(9, 2, 5, generator)
    hidden = torch.randn(9, HIDDEN, generator=generator)
    monkeypatch.setattr(glu_experts_triton, "MAX_PAIRS", 8)  # 4 tokens per launch
    out = run_kernel(hidden, arenas, slots, weights)
    assert relative_error(out, glu_experts_torch(hidden, arenas, slots, weights)) < 1e-5


def test_op_is_the_kernel_on_cuda_and_when_interpreting(monkeypatch):
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    assert glu_experts_op(torch.device("cuda")) is glu_experts
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    assert glu_experts_op(torch.device("cpu")) is glu_experts
