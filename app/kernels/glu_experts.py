"""SiLU-gated routed experts (GLM, DeepSeek) of one layer, read from expert-cache slots.

The arenas hold each expert as its checkpoint stores it, rows being output features:
`gate_proj.weight`, `up_proj.weight` [S, W, H] and `down_proj.weight` [S, H, W], in bf16 or FP8 e4m3.
An FP8 weight has its scale beside it: `<proj>.weight_scale` [S, out, 1] (compressed-tensors, per output
channel) or `<proj>.weight_scale_inv` [S, ceil(out / b0), ceil(in / b1)] (fp8, `fp8_block` = (b0, b1)).
Weights are dequantized at compute time, so the cache keeps the checkpoint's bytes.

`glu_experts` runs the Triton kernels of glu_experts_triton.py, `glu_experts_cpu` the C kernel of
cpu/glu_experts.c; `glu_experts_torch` is the reference with the same signature; `glu_experts_op` picks one for a
device.
"""

from collections.abc import Callable
from functools import partial

import torch

from app.kernels.choice import kernel_or_reference, triton_runs
from app.kernels.cpu import library as cpu
from app.kernels.expert_op import ExpertOp
from app.kernels.formats.fp8 import dequantize
from app.kernels.silu_glu import silu_glu
from app.quantization import BLOCK_SCALE, PER_CHANNEL_SCALE

PROJECTIONS = ("gate_proj", "up_proj", "down_proj")


def glu_experts_torch(
    hidden: torch.Tensor,
    arenas: dict[str, torch.Tensor],
    slots: torch.Tensor,
    weights: torch.Tensor,
    fp8_block: tuple[int, int] | None = None,
) -> torch.Tensor:
    """hidden [T, H], slots [T, k] (-1: skip), weights [T, k] -> weighted expert sum [T, H]."""
    out = torch.zeros_like(hidden)
    for slot in slots[slots >= 0].unique().tolist():
        tokens, picks = torch.where(slots == slot)
        gate, up, down = (slot_weight(arenas, name, slot, fp8_block, hidden.dtype) for name in PROJECTIONS)
        expert_out = silu_glu(hidden[tokens], gate, up, down)
        out.index_add_(0, tokens, expert_out * weights[tokens, picks, None].to(hidden.dtype))
    return out


def slot_weight(
    arenas: dict[str, torch.Tensor], projection: str, slot: int, fp8_block: tuple[int, int] | None, dtype: torch.dtype
) -> torch.Tensor:
    """One slot's `projection` weight [out, in] dequantized to `dtype`."""
    prefix = f"{projection}."
    stored = {name.removeprefix(prefix): arena[slot] for name, arena in arenas.items() if name.startswith(prefix)}
    return dequantize(stored, fp8_block, dtype)


def glu_experts(
    hidden: torch.Tensor,
    arenas: dict[str, torch.Tensor],
    slots: torch.Tensor,
    weights: torch.Tensor,
    fp8_block: tuple[int, int] | None = None,
    shared: torch.Tensor | None = None,
) -> torch.Tensor:
    """`glu_experts_torch` in Triton: one launch per projection for all tokens and picks; `shared` [1, C], the
    address row of an expert added at weight 1 where `runs_one_token`."""
    # imported here: Triton exists on Linux only, and TRITON_INTERPRET counts when its kernels are defined
    from app.kernels.glu_experts_triton import run_experts

    return run_experts(hidden, arenas, slots, weights, fp8_block, shared=shared)


def runs_one_token(tokens: int, arenas: dict[str, torch.Tensor]) -> bool:
    """Whether the Triton op sends these picks to the one-token kernels (glu_experts_one_token.py), which can add a
    shared expert: one token's experts, FP8 or 16-bit, whatever the arenas (`ExpertOp.takes_shared`'s signature)."""
    return tokens == 1


def glu_experts_cpu(
    hidden: torch.Tensor,
    arenas: dict[str, torch.Tensor],
    slots: torch.Tensor,
    weights: torch.Tensor,
    fp8_block: tuple[int, int] | None = None,
) -> torch.Tensor:
    """`glu_experts_torch` in C on the CPU's cores, reading the arenas (FP8, bf16 or float32) where they lie."""
    return cpu.run(*glu_on_host(arenas, fp8_block), hidden, slots, weights)


def glu_on_host(arenas: dict[str, torch.Tensor], fp8_block: tuple[int, int] | None) -> tuple[str, "cpu.GluExperts"]:
    """The C kernel and its structure over the arenas."""
    return "glu_experts", cpu.described(arenas, lambda: _glu_description(arenas, fp8_block), fp8_block)


def _glu_description(arenas: dict[str, torch.Tensor], fp8_block: tuple[int, int] | None) -> "cpu.GluExperts":
    width, size = arenas["gate_proj.weight"].shape[1:]
    if f"gate_proj.{BLOCK_SCALE}" in arenas:
        assert fp8_block is not None, "block scales need the checkpoint's weight_block_size"
        layout, suffix, block = "blocks", BLOCK_SCALE, fp8_block
    else:
        layout, suffix, block = "per_row", PER_CHANNEL_SCALE, (0, 0)
    scales = [arenas.get(f"{name}.{suffix}") for name in PROJECTIONS]
    return cpu.GluExperts(width, size, cpu.SCALE_LAYOUTS[layout], *block,
                          (cpu.Arena * 3)(*(cpu.arena(arenas[f"{name}.weight"]) for name in PROJECTIONS)),
                          (cpu.Arena * 3)(*(cpu.Arena() if s is None else cpu.arena(s) for s in scales)))


def glu_experts_from_table(
    hidden: torch.Tensor,
    arenas: dict[str, torch.Tensor],
    table: torch.Tensor,
    rows: torch.Tensor,
    weights: torch.Tensor,
    fp8_block: tuple[int, int] | None = None,
) -> torch.Tensor:
    """`glu_experts` reading each expert where its row of the address table [R, C] points (rows [T, k],
    -1: skip)."""
    from app.kernels.glu_experts_triton import run_from_table

    return run_from_table(hidden, arenas, table, rows, weights, fp8_block)


def glu_experts_op(device: torch.device) -> Callable[..., torch.Tensor]:
    return kernel_or_reference(device, glu_experts, glu_experts_torch, glu_experts_cpu)


def glu_expert_op(device: torch.device, fp8_block: tuple[int, int] | None) -> ExpertOp:
    """The op a GLM model hands its expert cache."""
    by_slots = partial(glu_experts_op(device), fp8_block=fp8_block)
    on_host = partial(glu_on_host, fp8_block=fp8_block) if cpu.library() else None
    if not triton_runs(device):
        return ExpertOp(by_slots, None, capturable=False, on_host=on_host)
    return ExpertOp(by_slots, partial(glu_experts_from_table, fp8_block=fp8_block), capturable=device.type == "cuda",
                    on_host=on_host, takes_shared=runs_one_token)
