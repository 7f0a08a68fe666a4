"""Decode attention (decode_attention.py) in two Triton launches. First, SPLITS programs per key head each
take an equal share of the keys the query sees and run an online softmax over it for every query head of the
head's group at once, BLOCK_L rows at a step: the group's queries are the rows of two tensor-core products (scores
and values), so each key row is read once, not once per query head (GLM-4.5-Air: 12 query heads a key head). Then
one program per query head joins the shares and the head's sink. Splitting by what is seen keeps every program
busy at any position and reads no row past it."""

import torch
import triton
import triton.language as tl

from app.kernels.expert_tiles import INTERPRETED

BLOCK_L = 64  # keys per step
SPLITS = 16  # shares of the keys per key head: 8 key heads x 16 fill the H200's 132 SMs about once
MIN_GROUP = 16  # a tensor-core product's rows at the least: smaller groups are padded


def run_decode_attention(
    q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, position: torch.Tensor, scale: float,
    sinks: torch.Tensor | None, window: int | None,
) -> torch.Tensor:
    """q [1, Hq, d], keys/values [C, Hkv, d], position [1], sinks [Hq] -> [1, Hq, d]."""
    _, heads, dim = q.shape
    kv_heads = keys.shape[1]
    assert q.shape[0] == 1 and heads % kv_heads == 0 and dim & (dim - 1) == 0
    assert keys.shape[1:] == values.shape[1:] == (kv_heads, dim) and keys.is_contiguous() and values.is_contiguous()
    q = q.contiguous()
    groups = heads // kv_heads
    shares = torch.empty((heads, SPLITS, dim), dtype=torch.float32, device=q.device)
    largest = torch.empty((heads, SPLITS), dtype=torch.float32, device=q.device)
    totals = torch.empty((heads, SPLITS), dtype=torch.float32, device=q.device)
    _share_kernel[(kv_heads, SPLITS)](
        q, keys, values, position, shares, largest, totals, scale, groups, kv_heads, window or 0,
        DIM=dim, BLOCK_L=BLOCK_L, SPLITS=SPLITS, BLOCK_G=max(MIN_GROUP, triton.next_power_of_2(groups)),
        F32=q.dtype == torch.float32, UPCAST=INTERPRETED, num_warps=4,
    )
    out = torch.empty_like(q)
    _join_kernel[(heads,)](
        shares, largest, totals, sinks if sinks is not None else q, out,
        HAS_SINKS=sinks is not None, DIM=dim, SPLITS=SPLITS, num_warps=1,
    )
    return out


@triton.jit
def _share_kernel(
    q_ptr, keys_ptr, values_ptr, position_ptr, shares_ptr, largest_ptr, totals_ptr, scale, groups, kv_heads,
    window, DIM: tl.constexpr, BLOCK_L: tl.constexpr, SPLITS: tl.constexpr, BLOCK_G: tl.constexpr,
    F32: tl.constexpr, UPCAST: tl.constexpr,
):
    """Share `split` of the keys key head `kv_head` sees -> for each query head of its group the unnormalised
    output [DIM], largest score and sum of exp(score - largest) (-inf and 0 for an empty share)."""
    kv_head, split = tl.program_id(0), tl.program_id(1)
    member = tl.arange(0, BLOCK_G)
    real = member < groups
    head = kv_head * groups + member  # [BLOCK_G] query heads; padding rows are zeros and never stored
    dim = tl.arange(0, DIM)
    q = tl.load(q_ptr + head[:, None] * DIM + dim[None, :], mask=real[:, None], other=0.0)
    precision: tl.constexpr = "tf32x3" if F32 else "tf32"
    if UPCAST:  # the interpreter's bf16 products are wrong
        q = q.to(tl.float32)
    position = tl.load(position_ptr).to(tl.int64)
    first = tl.where(window > 0, tl.maximum(position - window + 1, 0), 0)
    share = tl.cdiv(tl.cdiv(position + 1 - first, SPLITS), BLOCK_L) * BLOCK_L
    start = first + split * share
    end = tl.minimum(start + share, position + 1)
    largest = tl.full((BLOCK_G,), float("-inf"), tl.float32)
    total = tl.zeros((BLOCK_G,), tl.float32)
    acc = tl.zeros((BLOCK_G, DIM), tl.float32)
    for block in range(start, end, BLOCK_L):
        rows = block + tl.arange(0, BLOCK_L)
        seen = rows < end
        offsets = (rows[:, None] * kv_heads + kv_head) * DIM + dim[None, :]
        k = tl.load(keys_ptr + offsets, mask=seen[:, None], other=0.0)
        v = tl.load(values_ptr + offsets, mask=seen[:, None], other=0.0)
        if UPCAST:
            k, v = k.to(tl.float32), v.to(tl.float32)
        scores = tl.dot(q, tl.trans(k), input_precision=precision) * scale  # [BLOCK_G, BLOCK_L]
        scores = tl.where(seen[None, :], scores, float("-inf"))
        new_largest = tl.maximum(largest, tl.max(scores, axis=1))
        shrink = tl.exp(largest - new_largest)
        probs = tl.exp(scores - new_largest[:, None])
        acc = acc * shrink[:, None] + tl.dot(probs.to(v.dtype), v, input_precision=precision)
        total = total * shrink + tl.sum(probs, axis=1)
        largest = new_largest
    at = head * SPLITS + split
    tl.store(shares_ptr + at[:, None] * DIM + dim[None, :], acc, mask=real[:, None])
    tl.store(largest_ptr + at, largest, mask=real)
    tl.store(totals_ptr + at, total, mask=real)


@triton.jit
def _join_kernel(shares_ptr, largest_ptr, totals_ptr, sinks_ptr, out_ptr,
                 HAS_SINKS: tl.constexpr, DIM: tl.constexpr, SPLITS: tl.constexpr):
    """A head's shares and sink -> its output: each share rescaled to the largest score of all (the first share
    is never empty, so that is finite)."""
    head = tl.program_id(0)
    split, dim = tl.arange(0, SPLITS), tl.arange(0, DIM)
    largest = tl.load(largest_ptr + head * SPLITS + split)
    totals = tl.load(totals_ptr + head * SPLITS + split)
    shares = tl.load(shares_ptr + (head * SPLITS + split[:, None]) * DIM + dim[None, :])
    overall = tl.max(largest, axis=0)
    if HAS_SINKS:
        sink = tl.load(sinks_ptr + head).to(tl.float32)
        overall = tl.maximum(overall, sink)
    weights = tl.exp(largest - overall)  # empty shares: exp(-inf) = 0
    total = tl.sum(totals * weights, axis=0)
    if HAS_SINKS:
        total += tl.exp(sink - overall)
    out = tl.sum(shares * weights[:, None], axis=0) / total
    tl.store(out_ptr + head * DIM + dim, out.to(out_ptr.dtype.element_ty))
