"""Decode attention (decode_attention.py) in two Triton launches. First, SPLITS programs per query head each
take an equal share of the keys the query sees and run an online softmax over it, BLOCK_L rows at a step
(heads of one group read the same keys, mostly from L2); then one program per head joins the shares and the
head's sink. Splitting by what is seen keeps every program busy at any position and reads no row past it."""

import torch
import triton
import triton.language as tl

BLOCK_L = 64  # keys per step
SPLITS = 8  # shares of the keys per head: 64 heads x 8 fill the H200's 132 SMs about four times


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
    shares = torch.empty((heads, SPLITS, dim), dtype=torch.float32, device=q.device)
    largest = torch.empty((heads, SPLITS), dtype=torch.float32, device=q.device)
    totals = torch.empty((heads, SPLITS), dtype=torch.float32, device=q.device)
    _share_kernel[(heads, SPLITS)](
        q, keys, values, position, shares, largest, totals, scale, heads // kv_heads, kv_heads, window or 0,
        DIM=dim, BLOCK_L=BLOCK_L, SPLITS=SPLITS, num_warps=4,
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
    window, DIM: tl.constexpr, BLOCK_L: tl.constexpr, SPLITS: tl.constexpr,
):
    """Share `split` of the keys head `head` sees -> its unnormalised output [DIM], largest score and sum of
    exp(score - largest) (-inf and 0 for an empty share)."""
    head, split = tl.program_id(0), tl.program_id(1)
    kv_head = head // groups
    dim = tl.arange(0, DIM)
    q = tl.load(q_ptr + head * DIM + dim).to(tl.float32) * scale
    position = tl.load(position_ptr).to(tl.int64)
    first = tl.where(window > 0, tl.maximum(position - window + 1, 0), 0)
    share = tl.cdiv(tl.cdiv(position + 1 - first, SPLITS), BLOCK_L) * BLOCK_L
    start = first + split * share
    end = tl.minimum(start + share, position + 1)
    largest = tl.full((), float("-inf"), tl.float32)
    total = tl.full((), 0.0, tl.float32)
    acc = tl.zeros((DIM,), tl.float32)
    for block in range(start, end, BLOCK_L):
        rows = block + tl.arange(0, BLOCK_L)
        seen = rows < end
        offsets = (rows[:, None] * kv_heads + kv_head) * DIM + dim[None, :]
        k = tl.load(keys_ptr + offsets, mask=seen[:, None], other=0.0).to(tl.float32)
        v = tl.load(values_ptr + offsets, mask=seen[:, None], other=0.0).to(tl.float32)
        scores = tl.where(seen, tl.sum(k * q[None, :], axis=1), float("-inf"))  # [BLOCK_L]
        new_largest = tl.maximum(largest, tl.max(scores, axis=0))
        shrink = tl.exp(largest - new_largest)
        probs = tl.exp(scores - new_largest)
        acc = acc * shrink + tl.sum(probs[:, None] * v, axis=0)
        total = total * shrink + tl.sum(probs, axis=0)
        largest = new_largest
    at = head * SPLITS + split
    tl.store(shares_ptr + at * DIM + dim, acc)
    tl.store(largest_ptr + at, largest)
    tl.store(totals_ptr + at, total)


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
