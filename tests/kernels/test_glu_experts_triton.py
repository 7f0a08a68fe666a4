"""The Triton SiLU-gated experts against the torch reference, in Triton's interpreter (see conftest.py)."""

from dataclasses import replace

import pytest
import torch

from app.kernels import fp8_products_triton, glu_experts_triton
from app.kernels.expert_table import address_row, columns, slot_table
from app.kernels.glu_experts import (
    PROJECTIONS,
    glu_expert_op,
    glu_experts,
    glu_experts_op,
    glu_experts_torch,
    slot_weight,
)
from app.kernels.glu_experts_one_token import run_one_token
from app.kernels.glu_experts_triton import LaunchConfig, Projection, Tiles
from app.kernels.rows_times_vector_triton import RowTiles
from tests.fixtures.tiny_glm import quantize_fp8
from tests.kernels.poison import poisoned_allocations
from tests.kernels.test_fp8_prefill import dequantized_activations
from tests.kernels.test_gpt_oss_experts import random_routing, relative_error

HIDDEN, WIDTH = 80, 56  # not multiples of 32 (nor of 128): partial scale blocks, K and feature tails
FORMATS = {"bf16": None, "per-channel": None, "block128": (128, 128), "block32": (32, 32)}
# 32 pairs per tile (prefill), wider feature tiles and 64-input steps (block32 cuts them to 32)
WIDE = LaunchConfig(32, Tiles(64, 64), Tiles(64, 64))
# a launch of FP8 products against float32 products of its quantized inputs: its output's rounding to bf16
# (truncated in the interpreter)
FP8_PRODUCTS_ERROR = 4e-3


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
# interpreter takes about a second per case); a wider expert, whose steps loop over a full step then a tail and
# whose one-token down rows end in a tail
WIDER = (300, 196)
GRID = [
    *((tokens, picks, num_slots, fmt, None, (HIDDEN, WIDTH))
      for tokens, picks, num_slots in ((1, 4, 9), (3, 2, 4)) for fmt in FORMATS),
    *((16, 4, 6, fmt, None, (HIDDEN, WIDTH)) for fmt in ("bf16", "per-channel")),
    *((40, 3, 5, fmt, None, (HIDDEN, WIDTH)) for fmt in ("block128", "block32")),
    (40, 4, 9, "block32", WIDE, (HIDDEN, WIDTH)),
    *((tokens, 4, 6, fmt, None, WIDER) for tokens in (1, 5) for fmt in ("bf16", "per-channel")),
]


@pytest.mark.parametrize(("tokens", "picks", "num_slots", "fmt", "config", "shape"), GRID)
def test_kernel_matches_reference(tokens, picks, num_slots, fmt, config, shape):
    generator = torch.Generator().manual_seed(tokens * 100 + picks * 10 + num_slots + (config is WIDE))
    arenas = random_arenas(num_slots, fmt, generator, *shape)
    slots, weights = random_routing(tokens, picks, num_slots, generator)
    slots[0, -1] = -1  # a skipped pick beside token 0's first, one token too
    hidden = torch.randn(tokens, shape[0], generator=generator)
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


def shared_expert(fmt: str, generator: torch.Generator) -> dict[str, torch.Tensor]:
    """One more expert in the arenas' format, in tensors of its own (GLM's shared expert)."""
    return {name: arena[0].clone() for name, arena in random_arenas(1, fmt, generator).items()}


def shared_reference(hidden: torch.Tensor, shared: dict[str, torch.Tensor], fmt: str) -> torch.Tensor:
    """The shared expert's output at weight 1, by the torch reference."""
    one_slot = {name: t[None] for name, t in shared.items()}
    return glu_experts_torch(hidden, one_slot, torch.zeros(1, 1, dtype=torch.long), torch.ones(1, 1), FORMATS[fmt])


# the shared expert as one more pick: beside routed picks (some skipped), and alone where every pick is skipped
@pytest.mark.parametrize(("fmt", "skip_all", "tiles"), [
    ("per-channel", False, RowTiles(16, 64, warps=2, fold=16)),
    ("block32", False, RowTiles(8, 16)),
    ("block128", True, RowTiles(4, 64, fold=2)),
    ("bf16", False, RowTiles(8, 32, fold=4)),
])
def test_one_token_adds_a_shared_expert_from_its_own_row(fmt, skip_all, tiles):
    generator = torch.Generator().manual_seed(len(fmt) + 3 * skip_all)
    arenas, shared = random_arenas(7, fmt, generator), shared_expert(fmt, generator)
    slots, weights = random_routing(1, 5, 7, generator)
    if skip_all:
        slots.fill_(-1)
    hidden = torch.randn(1, HIDDEN, generator=generator)
    projections = tuple(Projection.of(arenas, name, FORMATS[fmt]) for name in ("gate_proj", "up_proj", "down_proj"))
    row = address_row(shared, arenas)
    with poisoned_allocations():
        out = run_one_token(hidden, projections, slot_table(arenas), slots, weights, columns(arenas), (tiles, tiles),
                            shared=row)
    routed = glu_experts_torch(hidden, arenas, slots, weights, fp8_block=FORMATS[fmt])
    alone = shared_reference(hidden, shared, fmt)
    assert alone.abs().max() > 0.1 * routed.abs().max()  # the shared expert's part outweighs the tolerance
    assert relative_error(out, routed + alone) < 1e-5


@pytest.mark.parametrize("fmt", ["block32", "bf16"])
def test_the_op_takes_a_shared_expert_for_one_token(fmt):
    """FP8 or 16-bit experts: one token's go to the one-token kernels, which add the shared expert's row."""
    generator = torch.Generator().manual_seed(2)
    arenas, shared = random_arenas(6, fmt, generator), shared_expert(fmt, generator)
    op = glu_expert_op(torch.device("cpu"), FORMATS[fmt])
    assert op.takes_shared(1, arenas) and not op.takes_shared(2, arenas)
    slots, weights = random_routing(1, 4, 6, generator)
    hidden = torch.randn(1, HIDDEN, generator=generator)
    with poisoned_allocations():
        out = op(hidden, arenas, slots, weights, shared=address_row(shared, arenas))
    expected = (glu_experts_torch(hidden, arenas, slots, weights, fp8_block=FORMATS[fmt])
                + shared_reference(hidden, shared, fmt))
    assert relative_error(out, expected) < 1e-5


def test_an_expert_unlike_the_arenas_gets_no_address_row():
    generator = torch.Generator().manual_seed(4)
    arenas, shared = random_arenas(3, "block32", generator), shared_expert("block32", generator)
    assert address_row(shared, arenas) is not None
    wider = shared_expert("block32", generator) | {"down_proj.weight": torch.zeros(HIDDEN, WIDTH + 8).to(
        torch.float8_e4m3fn)}
    assert address_row(wider, arenas) is None
    assert address_row(shared_expert("per-channel", generator), arenas) is None  # other scale names
    offset = torch.empty(WIDTH * HIDDEN + 1, dtype=torch.float8_e4m3fn)[1:].view(WIDTH, HIDDEN)
    assert address_row(shared | {"gate_proj.weight": offset}, arenas) is None  # 16-byte loads would be misaligned


# a verify block; prefill chunks converting FP8 weights (what GPUs before sm_89 run; FP8 products are below), whose
# inputs go to float16 first, in each FP8 format (bf16 weights are covered on the GPU: the interpreter's bf16 products
# are wrong)
@pytest.mark.parametrize(("tokens", "fmt", "shape"), [
    (12, "block128", (HIDDEN, WIDTH)), (20, "block128", (HIDDEN, WIDTH)), (20, "per-channel", WIDER),
    (20, "block32", WIDER),
])
def test_bfloat16_hidden_matches_float32_reference(tokens, fmt, shape):
    generator = torch.Generator().manual_seed(11)
    arenas = random_arenas(6, fmt, generator, *shape)
    slots, weights = random_routing(tokens, 4, 6, generator)
    hidden = torch.randn(tokens, shape[0], generator=generator).to(torch.bfloat16)
    converting = replace(glu_experts_triton.pick_config(slots.numel()), fp8_products=False)
    out = run_kernel(hidden, arenas, slots, weights.to(torch.bfloat16), fp8_block=FORMATS[fmt], config=converting)
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


# prefill chunks of FP8 experts with 16-bit hidden states on FP8 tensor cores: x and the activations quantized to
# e4m3 (fp8_products_triton.py); skipped picks, tails, both scale formats and block32's steps of 32
@pytest.mark.parametrize(("tokens", "fmt", "shape", "dtype"), [
    (20, "per-channel", WIDER, torch.bfloat16), (40, "block128", (HIDDEN, WIDTH), torch.float16),
    (20, "block32", WIDER, torch.bfloat16),
])
def test_fp8_products_of_a_prefill_chunk_match_float32_reference(tokens, fmt, shape, dtype, monkeypatch):
    generator = torch.Generator().manual_seed(13)
    arenas = random_arenas(6, fmt, generator, *shape)
    slots, weights = random_routing(tokens, 4, 6, generator)
    slots[3, :2] = -1
    hidden = torch.randn(tokens, shape[0], generator=generator).to(dtype)
    out, errors = fp8_prefill_errors(hidden, arenas, slots, weights.to(dtype), FORMATS[fmt], monkeypatch)
    assert out.dtype == dtype
    assert max(errors) < FP8_PRODUCTS_ERROR


def fp8_prefill_errors(hidden, arenas, slots, weights, block, monkeypatch) -> tuple[torch.Tensor, list[float]]:
    """The experts of a prefill chunk on FP8 products -> (output, [gate_up's error, down's]): each launch against
    float32 products of its quantized inputs, gate_up's activations from x quantized, then down's sums from those
    activations quantized (a reference computing its own activations would round some of them to a neighbouring
    16-bit value, and a row whose largest value moves re-rolls all of its e4m3 roundings)."""
    quantized, quantize = [], fp8_products_triton.quantize_activations
    monkeypatch.setattr(fp8_products_triton, "quantize_activations",
                        lambda x: quantized.append(x.clone()) or quantize(x))
    plans, plan_tiles = [], glu_experts_triton.plan_tiles
    monkeypatch.setattr(glu_experts_triton, "plan_tiles", lambda *args: plans.append(plan_tiles(*args)) or plans[-1])
    out = run_kernel(hidden, arenas, slots, weights, fp8_block=block)
    x, activations = quantized  # x, then the activations in the plan's order
    assert torch.equal(x, hidden)

    picks, num_slots = slots.shape[1], arenas["down_proj.weight"].shape[0]
    pairs = plans[0].sorted_pairs[:slots.numel()].long()
    used = slots.flatten()[pairs] >= 0
    pairs, activations = pairs[used].tolist(), activations[used]
    expert = {name: [slot_weight(arenas, name, slot, block, torch.float32) for slot in range(num_slots)]
              for name in PROJECTIONS}
    seen_x, seen_activations = dequantized_activations(hidden), dequantized_activations(activations)
    expected_activations = torch.empty_like(activations, dtype=torch.float32)
    expected_out = torch.zeros(hidden.shape, device=hidden.device)
    for row, pair in enumerate(pairs):
        token, slot = pair // picks, slots.flatten()[pair].item()
        gate, up = (seen_x[token] @ expert[name][slot].T for name in PROJECTIONS[:2])
        expected_activations[row] = torch.nn.functional.silu(gate) * up
        down = seen_activations[row] @ expert["down_proj"][slot].T
        expected_out[token] += weights.flatten()[pair].float() * down
    return out, [relative_error(activations, expected_activations), relative_error(out, expected_out)]
