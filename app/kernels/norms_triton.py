"""The residual add and RMSNorm of norms.py in one Triton kernel (or the RMSNorm alone): one program per token; for
the MXFP4 one-token experts also the norm in float16 pairs (mxfp4_half_pairs.py), which then take no conversion
launch of their own."""

import torch
import triton
import triton.language as tl

from app.kernels.dependent_launch import after_earlier_kernels, dependent_launch
from app.kernels.mxfp4_half_pairs import store_half_pairs
from app.kernels.pick_rows import PickRows


def run_add_rms_norm(
    x: torch.Tensor, delta: torch.Tensor | PickRows | None, weight: torch.Tensor, eps: float,
    half_pairs: bool = False,
) -> tuple[torch.Tensor, ...]:
    """x, delta [T, H], weight [H] -> (x + delta, its RMSNorm), both in x's dtype (no delta: x itself and its
    RMSNorm; PickRows: their sum in x's dtype, as `sum_picks` gives it, is the delta); with `half_pairs` also the
    norm as `mxfp4_half_pairs.half_pairs` gives it ((pairs [T, H] float16, unscale [T] float32)), from the same
    launch."""
    if isinstance(delta, PickRows):
        delta, slots, picks = delta.rows.contiguous(), delta.slots.contiguous(), delta.slots.shape[1]
    else:
        delta, slots, picks = None if delta is None else delta.contiguous(), None, 0
    assert x.dim() == 2 and weight.shape == (x.shape[1],)
    assert delta is None or delta.shape == (x.shape[0] * max(picks, 1), x.shape[1])
    x = x.contiguous()
    total, normed = x if delta is None else torch.empty_like(x), torch.empty_like(x)
    tokens, hidden = x.shape
    pairs = torch.empty((tokens, hidden), dtype=torch.float16, device=x.device) if half_pairs else None
    unscale = torch.empty(tokens, dtype=torch.float32, device=x.device) if half_pairs else None
    _add_rms_norm_kernel[(tokens,)](
        x, delta, slots, weight, total, normed, pairs, unscale, hidden, eps, BLOCK=triton.next_power_of_2(hidden),
        PICKS=picks, PAIRS_K=hidden if half_pairs else 0, num_warps=8, **dependent_launch(x.device),
    )
    return (total, normed, (pairs, unscale)) if half_pairs else (total, normed)


@triton.jit
def _add_rms_norm_kernel(x_ptr, delta_ptr, slots_ptr, weight_ptr, total_ptr, normed_ptr, pairs_ptr, unscale_ptr,
                         hidden, eps, BLOCK: tl.constexpr, PICKS: tl.constexpr, PAIRS_K: tl.constexpr,
                         PDL: tl.constexpr):
    after_earlier_kernels(PDL)
    columns = tl.arange(0, BLOCK)
    inside = columns < hidden
    row = tl.program_id(0).to(tl.int64) * hidden
    total = tl.load(x_ptr + row + columns, mask=inside, other=0.0)
    if PICKS > 0:  # the token's pick rows [PICKS, H] summed in pick order, rounded as sum_picks stores the sum
        delta = tl.zeros((BLOCK,), tl.float32)
        for pick in tl.static_range(PICKS):
            # a skipped pick's row is not read: no columns of it are inside
            width = tl.where(tl.load(slots_ptr + tl.program_id(0) * PICKS + pick) >= 0, hidden, 0)
            delta += tl.load(delta_ptr + row * PICKS + pick * hidden + columns, mask=columns < width, other=0.0)
        delta = delta.to(x_ptr.dtype.element_ty)
    elif delta_ptr is not None:
        delta = tl.load(delta_ptr + row + columns, mask=inside, other=0.0)
    if delta_ptr is not None:
        # rounded to x's dtype, as the reference's add is: the norm reads what is stored
        total = (total.to(tl.float32) + delta.to(tl.float32)).to(total_ptr.dtype.element_ty)
        tl.store(total_ptr + row + columns, total, mask=inside)
    total = total.to(tl.float32)
    scale = tl.rsqrt(tl.sum(total * total, axis=0) / hidden + eps)
    weight = tl.load(weight_ptr + columns, mask=inside, other=0.0).to(tl.float32)
    normed = (total * scale * weight).to(normed_ptr.dtype.element_ty)
    tl.store(normed_ptr + row + columns, normed, mask=inside)
    if PAIRS_K > 0:  # from the norm as stored, as the separate conversion would read it
        store_half_pairs(normed.to(tl.float32), columns, pairs_ptr + row, unscale_ptr + tl.program_id(0), PAIRS_K)
