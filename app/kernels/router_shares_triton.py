"""A router's product at decode split over programs, for the routers of router_triton.py and
sigmoid_router_triton.py: programs over (block of experts, share of the inputs) each read their piece of the weight
once and write partial sums for every token, so the weight is read by many SMs (GLM-4.5-Air's 2 MB router in 128
programs, gpt-oss-120b's 0.7 MB in 96; one program per token would read it through one SM). The program that
finishes its shares last (an arrival counter) then chooses for every token, in the same launch, and sets the counter
back to 0 for the next launch. So these launches share one counter a device and must not run concurrently (the
engine routes on one stream)."""

from dataclasses import dataclass

import torch
import triton
import triton.language as tl

DECODE_TOKENS = 16  # passes of up to this many tokens take the split product
BLOCK_E = 16  # experts per product program
BLOCK_H = 256  # inputs per product program

_ARRIVALS: dict[torch.device, torch.Tensor] = {}


def _arrivals(device: torch.device) -> torch.Tensor:
    """The device's arrival counter [1] int32: 0 between launches (the last program resets it)."""
    if device not in _ARRIVALS:
        # a capture would record the zeroing instead of running it: the first launch must come before any capture
        assert device.type != "cuda" or not torch.cuda.is_current_stream_capturing(), "route once before capturing"
        _ARRIVALS[device] = torch.zeros(1, dtype=torch.int32, device=device)
    return _ARRIVALS[device]


@dataclass(frozen=True)
class SplitLaunch:
    """What a split router launch takes besides its own arguments: its grid (cdiv(E, BLOCK_E), shares); the partial
    sums [shares, T, E] float32 and the arrival counter; the slot row, counter and slots [1, k] of one token's
    lookup (`picked` standing in for those it never reads); and its constants."""

    grid: tuple[int, int]
    buffers: tuple[torch.Tensor, torch.Tensor]
    slot_pointers: tuple[torch.Tensor, torch.Tensor, torch.Tensor]
    slots: torch.Tensor | None  # the picks' slots it fills, None where it looks nothing up
    constants: dict


def split_launch(
    x: torch.Tensor, experts: int, picked: torch.Tensor, slot_row: torch.Tensor | None, uses: torch.Tensor | None
) -> SplitLaunch:
    """For x [T, H] routed among `experts` into `picked` [T, k]; where `slot_row` is given, one token's slots are
    looked up in it ([E + 1] int64, resident_slots.py; `uses` [] int64 grows by the picks with a slot)."""
    (tokens, hidden), device = x.shape, x.device
    shares = torch.empty((triton.cdiv(hidden, BLOCK_H), tokens, experts), dtype=torch.float32, device=device)
    slots, slot_pointers = None, (picked, picked, picked)
    if slot_row is not None:
        assert picked.shape[0] == 1 and slot_row.shape == (experts + 1,) and slot_row.is_contiguous() \
            and slot_row.dtype == uses.dtype == torch.int64 and uses.numel() == 1, \
            "one token's slots from a row [E + 1] int64, counted in `uses` [] int64"
        slots = torch.empty_like(picked)
        slot_pointers = (slot_row, uses, slots)
    return SplitLaunch((triton.cdiv(experts, BLOCK_E), shares.shape[0]), (shares, _arrivals(device)), slot_pointers,
                       slots, dict(BLOCK_E=BLOCK_E, BLOCK_H=BLOCK_H, HAS_SLOTS=slot_row is not None))


@triton.jit
def product_shares(x_ptr, weight_ptr, shares_ptr, tokens, hidden, experts, BLOCK_E: tl.constexpr,
                   BLOCK_H: tl.constexpr):
    """shares[share, t, e] = sum over the share's inputs of x[t] * W[e] in float32, for the program's experts."""
    expert = tl.program_id(0) * BLOCK_E + tl.arange(0, BLOCK_E)
    share = tl.program_id(1)
    columns = share * BLOCK_H + tl.arange(0, BLOCK_H)
    inside = columns < hidden
    w = tl.load(weight_ptr + expert[:, None].to(tl.int64) * hidden + columns[None, :],
                mask=(expert < experts)[:, None] & inside[None, :], other=0.0).to(tl.float32)
    for token in range(tokens):
        x = tl.load(x_ptr + token * hidden + columns, mask=inside, other=0.0).to(tl.float32)
        tl.store(shares_ptr + (share * tokens + token) * experts + expert, tl.sum(w * x[None, :], axis=1),
                 mask=expert < experts)


@triton.jit
def arrives_last(arrivals_ptr):
    """Whether this program is the last of its launch to have written its shares; that one resets the counter. Its
    reads of the others' shares must go to L2 (.cg): they were written by other programs of the same launch."""
    tl.debug_barrier()  # every thread's shares are written before the arrival that publishes them
    programs = tl.num_programs(0) * tl.num_programs(1)
    last = tl.atomic_add(arrivals_ptr, 1, sem="acq_rel") == programs - 1
    if last:
        tl.store(arrivals_ptr, 0)
    return last
