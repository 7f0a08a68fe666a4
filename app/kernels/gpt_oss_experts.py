"""GPT-OSS routed experts of one layer, read from expert-cache slots.

Weights come in either checkpoint format: MXFP4 (`gate_up_proj_blocks/_scales`, rows are output
features) or dequantized (`gate_up_proj` [S, H, 2W], `down_proj` [S, W, H]). Biases are always
`gate_up_proj_bias` [S, 2W] and `down_proj_bias` [S, H].

`gpt_oss_experts` runs the Triton kernels of gpt_oss_experts_triton.py, `gpt_oss_experts_cpu` the C kernel of
cpu/gpt_oss_experts.c (MXFP4 only); `gpt_oss_experts_torch` is the reference with the same signature;
`gpt_oss_experts_op` picks one for a device.
"""

from collections.abc import Callable
from functools import partial

import torch

from app.kernels.choice import kernel_or_reference, triton_runs
from app.kernels.cpu import library as cpu
from app.kernels.expert_op import ExpertOp
from app.kernels.formats.mxfp4 import decode_mxfp4
from app.kernels.pick_rows import PickRows

MXFP4_TENSORS = ("gate_up_proj_blocks", "gate_up_proj_scales", "gate_up_proj_bias", "down_proj_blocks",
                 "down_proj_scales", "down_proj_bias")


def clamped_swiglu(gate_up: torch.Tensor, limit: float, alpha: float) -> torch.Tensor:
    """gate_up [T, 2W] with gate/up interleaved (gate even, up odd) -> [T, W]."""
    gate = gate_up[..., ::2].clamp(max=limit)
    up = gate_up[..., 1::2].clamp(-limit, limit)
    return (up + 1) * gate * torch.sigmoid(alpha * gate)


def _slot_weights(arenas: dict[str, torch.Tensor], slot: int, dtype: torch.dtype):
    """(gate_up [H, 2W], down [W, H]) of one slot, in `dtype`."""
    if "gate_up_proj_blocks" in arenas:
        gate_up = decode_mxfp4(arenas["gate_up_proj_blocks"][slot], arenas["gate_up_proj_scales"][slot], dtype)
        down = decode_mxfp4(arenas["down_proj_blocks"][slot], arenas["down_proj_scales"][slot], dtype)
        return gate_up.T, down.T
    return arenas["gate_up_proj"][slot].to(dtype), arenas["down_proj"][slot].to(dtype)


def gpt_oss_experts_torch(
    hidden: torch.Tensor,
    arenas: dict[str, torch.Tensor],
    slots: torch.Tensor,
    weights: torch.Tensor,
    limit: float,
    alpha: float,
) -> torch.Tensor:
    """hidden [T, H], slots [T, k] (-1: skip), weights [T, k] -> weighted expert sum [T, H]."""
    out = torch.zeros_like(hidden)
    for slot in slots[slots >= 0].unique().tolist():
        tokens, picks = torch.where(slots == slot)
        gate_up_w, down_w = _slot_weights(arenas, slot, hidden.dtype)
        gate_up = hidden[tokens] @ gate_up_w + arenas["gate_up_proj_bias"][slot].to(hidden.dtype)
        expert_out = clamped_swiglu(gate_up, limit, alpha) @ down_w + arenas["down_proj_bias"][slot].to(hidden.dtype)
        out.index_add_(0, tokens, expert_out * weights[tokens, picks, None])
    return out


def gpt_oss_experts(
    hidden: torch.Tensor,
    arenas: dict[str, torch.Tensor],
    slots: torch.Tensor,
    weights: torch.Tensor,
    limit: float,
    alpha: float,
    hidden_pairs: tuple[torch.Tensor, torch.Tensor] | None = None,
) -> torch.Tensor | PickRows:
    """`gpt_oss_experts_torch` in Triton: one launch per projection for all tokens and picks; `hidden_pairs`, the
    hidden states already in float16 pairs where `takes_hidden_pairs`, and then the picks' rows before their sum,
    for the norm after to add (pick_rows.py)."""
    # imported here: Triton exists on Linux only, and TRITON_INTERPRET counts when its kernels are defined
    from app.kernels.gpt_oss_experts_triton import run_experts

    return run_experts(hidden, arenas, slots, weights, limit, alpha, hidden_pairs=hidden_pairs)


def takes_hidden_pairs(num_pairs: int, dtype: torch.dtype, arenas: dict[str, torch.Tensor]) -> bool:
    """Whether `gpt_oss_experts` reads that many (token, pick) pairs' hidden states of `dtype` in float16 pairs
    (MXFP4 weights, 16-bit hidden states, the one-token programs), which the norm before can then give it (and
    the norm after add its picks)."""
    from app.kernels.gpt_oss_experts_triton import pick_config, runs_in_half_pairs

    return "gate_up_proj_blocks" in arenas and runs_in_half_pairs(pick_config(num_pairs, mxfp4=True), dtype)


def gpt_oss_experts_cpu(
    hidden: torch.Tensor,
    arenas: dict[str, torch.Tensor],
    slots: torch.Tensor,
    weights: torch.Tensor,
    limit: float,
    alpha: float,
) -> torch.Tensor:
    """`gpt_oss_experts_torch` in C on the CPU's cores, reading MXFP4 arenas where they lie."""
    return cpu.run(*gpt_oss_on_host(arenas, limit, alpha), hidden, slots, weights)


def gpt_oss_on_host(arenas: dict[str, torch.Tensor], limit: float, alpha: float) -> tuple[str, "cpu.GptOssExperts"]:
    """The C kernel and its structure over MXFP4 arenas."""
    width, size = arenas["gate_up_proj_bias"].shape[1] // 2, arenas["down_proj_bias"].shape[1]
    return "gpt_oss_experts", cpu.described(arenas, lambda: cpu.GptOssExperts(
        width, size, limit, alpha, *(cpu.arena(arenas[name]) for name in MXFP4_TENSORS)), limit, alpha)


def gpt_oss_experts_from_table(
    hidden: torch.Tensor,
    arenas: dict[str, torch.Tensor],
    table: torch.Tensor,
    rows: torch.Tensor,
    weights: torch.Tensor,
    limit: float,
    alpha: float,
) -> torch.Tensor:
    """`gpt_oss_experts` reading each expert where its row of the address table [R, C] points (rows [T, k],
    -1: skip)."""
    from app.kernels.gpt_oss_experts_triton import run_from_table

    return run_from_table(hidden, arenas, table, rows, weights, limit, alpha)


def gpt_oss_experts_op(device: torch.device, mxfp4: bool = True) -> Callable[..., torch.Tensor]:
    """The op for arenas in MXFP4 (`mxfp4`) or dequantized, which only the Triton kernels and the reference read."""
    return kernel_or_reference(device, gpt_oss_experts, gpt_oss_experts_torch, gpt_oss_experts_cpu if mxfp4 else None)


def gpt_oss_expert_op(device: torch.device, limit: float, alpha: float, mxfp4: bool) -> ExpertOp:
    """The op a GPT-OSS model hands its expert cache."""
    by_table = partial(gpt_oss_experts_from_table, limit=limit, alpha=alpha) if triton_runs(device) else None
    on_host = partial(gpt_oss_on_host, limit=limit, alpha=alpha) if mxfp4 and cpu.library() else None
    return ExpertOp(partial(gpt_oss_experts_op(device, mxfp4), limit=limit, alpha=alpha), by_table,
                    capturable=device.type == "cuda", on_host=on_host,
                    **({"takes_hidden_pairs": takes_hidden_pairs} if triton_runs(device) else {}))
