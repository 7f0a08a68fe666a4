"""Decode attention (decode_attention.py) in two Triton launches. First, several programs per key head each
take an equal share of the keys the queries see and run an online softmax over it for every query head of the
head's group and every token of the block at once, up to 64 rows at a step: the group's queries are the rows of two
tensor-core products (scores and values), so each key row is read once, not once per query head (GLM-4.5-Air: 12
query heads a key head) or token (a verify block; each row masks the keys past its own position). Then programs per
token, query head and block of its columns (MLA's 512 in four) join the shares that hold rows (at 512 rows MLA fills
33 of its 128) and the head's sink. Splitting by what is seen keeps every program busy at any position and reads no
row past the last.

MLA (GLM-4.7-Flash, mla.py) is one key head of 20 query heads over latent rows [kv_lora_rank + rope]: its keys
are whole rows, its values their first kv_lora_rank columns (read once, as the keys' first part), and the rope
columns add a second, narrower product to the scores. One key head gets more shares, so that long contexts still
spread over the SMs."""

import torch
import triton
import triton.language as tl

from app.kernels.decode_attention import is_power_of_two, takes_head_dim, takes_queries
from app.kernels.dependent_launch import after_earlier_kernels, dependent_launch
from app.kernels.expert_tiles import INTERPRETED

STEP_BYTES = 32 * 1024  # a step's key rows at the most: the tiles of a step fit shared memory (MLA: 16 rows)
PROGRAMS = 128  # key heads x shares of their keys: about one wave on the H200's 132 SMs (8 key heads: 16 shares)
JOIN_CHUNK = 16  # shares the join adds at a time
JOIN_COLUMNS = 128  # a join program's output columns at the most
MIN_GROUP = 16  # a tensor-core product's rows at the least: smaller groups are padded


def run_decode_attention(
    q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, position: torch.Tensor, scale: float,
    sinks: torch.Tensor | None, window: int | None,
) -> torch.Tensor:
    """q [T, Hq, d + r], keys [C, Hkv, d + r], values [C, Hkv, d], position [T] (non-decreasing), sinks [Hq] ->
    [T, Hq, d]; d a power of two of 16 or more (a tensor-core product's), r 0 or a power of two (MLA's rope
    columns); values may be the keys' first d columns (`keys[..., :d]`); T x Hq / Hkv at most MAX_QUERY_ROWS."""
    tokens, heads, key_dim = q.shape
    kv_heads, dim = keys.shape[1], values.shape[2]
    rope = key_dim - dim
    assert takes_queries(tokens, heads, kv_heads) and position.shape == (tokens,) and position.is_contiguous()
    assert heads % kv_heads == 0 and takes_head_dim(dim)
    assert rope == 0 or is_power_of_two(rope)
    assert keys.shape[1:] == (kv_heads, key_dim) and values.shape[:2] == keys.shape[:2]
    assert keys.stride(2) == values.stride(2) == 1 and keys.stride(1) == key_dim, "rows of contiguous heads"
    values_are_keys = values.data_ptr() == keys.data_ptr() and values.stride()[:2] == keys.stride()[:2]
    q = q.contiguous()
    groups = heads // kv_heads
    splits = triton.next_power_of_2(triton.cdiv(PROGRAMS, kv_heads))
    shares = torch.empty((tokens * heads, splits, dim), dtype=torch.float32, device=q.device)
    largest = torch.empty((tokens * heads, splits), dtype=torch.float32, device=q.device)
    totals = torch.empty((tokens * heads, splits), dtype=torch.float32, device=q.device)
    row_bytes = key_dim * keys.element_size()
    block_l = min(64, max(16, 1 << ((STEP_BYTES // row_bytes).bit_length() - 1)))  # a power of two, >= 16 for tl.dot
    wide = dim > 128  # MLA's 512: more warps for the [group, 512] accumulator
    _share_kernel[(kv_heads, splits)](
        q, keys, values, position, shares, largest, totals, scale, tokens, groups, kv_heads, window or 0,
        keys.stride(0), values.stride(0), values.stride(1),
        DIM=dim, ROPE=rope, ROPE_BLOCK=max(16, rope), VALUES_ARE_KEYS=values_are_keys, BLOCK_L=block_l,
        SPLITS=splits, BLOCK_G=max(MIN_GROUP, triton.next_power_of_2(tokens * groups)), F32=q.dtype == torch.float32,
        UPCAST=INTERPRETED,
        num_warps=8 if wide else 4, num_stages=2 if wide else 3, **dependent_launch(q.device),
    )
    out = torch.empty((tokens, heads, dim), dtype=q.dtype, device=q.device)
    columns = min(dim, JOIN_COLUMNS)
    _join_kernel[(tokens * heads, dim // columns)](
        shares, largest, totals, sinks if sinks is not None else q, position, out, tokens, heads, window or 0,
        HAS_SINKS=sinks is not None, DIM=dim, COLUMNS=columns, SPLITS=splits, CHUNK=min(JOIN_CHUNK, splits),
        BLOCK_L=block_l, num_warps=1, **dependent_launch(q.device),
    )
    return out


@triton.jit
def _first_seen(position, window):
    """The first row a query at `position` sees."""
    return tl.where(window > 0, tl.maximum(position - window + 1, 0), 0)


@triton.jit
def _share_rows(position_ptr, tokens, window, SPLITS: tl.constexpr, BLOCK_L: tl.constexpr):
    """-> (the last query's position, the first row any query sees, the rows of a share: whole steps, SPLITS
    shares covering the rows the queries see)."""
    position = tl.load(position_ptr + tokens - 1).to(tl.int64)
    first = _first_seen(tl.load(position_ptr).to(tl.int64), window)
    return position, first, tl.cdiv(tl.cdiv(position + 1 - first, SPLITS), BLOCK_L) * BLOCK_L


@triton.jit
def _share_kernel(
    q_ptr, keys_ptr, values_ptr, position_ptr, shares_ptr, largest_ptr, totals_ptr, scale, tokens, groups, kv_heads,
    window, key_row_stride, value_row_stride, value_head_stride,
    DIM: tl.constexpr, ROPE: tl.constexpr, ROPE_BLOCK: tl.constexpr, VALUES_ARE_KEYS: tl.constexpr,
    BLOCK_L: tl.constexpr, SPLITS: tl.constexpr, BLOCK_G: tl.constexpr, F32: tl.constexpr, UPCAST: tl.constexpr,
    PDL: tl.constexpr,
):
    """Share `split` of the keys key head `kv_head`'s queries see -> for each token and query head of its group the
    unnormalised output [DIM], largest score and sum of exp(score - largest) (-inf and 0 where it sees none)."""
    after_earlier_kernels(PDL)
    kv_head, split = tl.program_id(0), tl.program_id(1)
    member = tl.arange(0, BLOCK_G)
    token = member // groups
    real = token < tokens
    head = kv_head * groups + member % groups  # [BLOCK_G] query heads; padding rows are zeros and never stored
    query = token * (kv_heads * groups) + head  # the row of q, and of the shares, of (token, head)
    dim = tl.arange(0, DIM)
    q_rows = q_ptr + query[:, None] * (DIM + ROPE)
    q = tl.load(q_rows + dim[None, :], mask=real[:, None], other=0.0)
    precision: tl.constexpr = "tf32x3" if F32 else "tf32"
    if UPCAST:  # the interpreter's bf16 products are wrong
        q = q.to(tl.float32)
    if ROPE > 0:
        rope = tl.arange(0, ROPE_BLOCK)  # padded to a tensor-core product's 16 (tiny test models: 8)
        q_rope = tl.load(q_rows + DIM + rope[None, :], mask=real[:, None] & (rope[None, :] < ROPE), other=0.0)
        if UPCAST:
            q_rope = q_rope.to(tl.float32)
    position, first, share = _share_rows(position_ptr, tokens, window, SPLITS, BLOCK_L)
    start = first + split * share
    end = tl.minimum(start + share, position + 1)
    row_position = tl.load(position_ptr + token, mask=real, other=0).to(tl.int64)  # [BLOCK_G]
    row_first = _first_seen(row_position, window)
    largest = tl.full((BLOCK_G,), float("-inf"), tl.float32)
    total = tl.zeros((BLOCK_G,), tl.float32)
    acc = tl.zeros((BLOCK_G, DIM), tl.float32)
    for block in range(start, end, BLOCK_L):
        rows = block + tl.arange(0, BLOCK_L)
        seen = rows < end
        key_rows = keys_ptr + rows[:, None].to(tl.int64) * key_row_stride + kv_head * (DIM + ROPE)
        k = tl.load(key_rows + dim[None, :], mask=seen[:, None], other=0.0)
        if VALUES_ARE_KEYS:
            v = k
        else:
            value_rows = values_ptr + rows[:, None].to(tl.int64) * value_row_stride + kv_head * value_head_stride
            v = tl.load(value_rows + dim[None, :], mask=seen[:, None], other=0.0)
        if UPCAST:
            k, v = k.to(tl.float32), v.to(tl.float32)
        scores = tl.dot(q, tl.trans(k), input_precision=precision)  # [BLOCK_G, BLOCK_L]
        if ROPE > 0:
            k_rope = tl.load(key_rows + DIM + rope[None, :], mask=seen[:, None] & (rope[None, :] < ROPE), other=0.0)
            if UPCAST:
                k_rope = k_rope.to(tl.float32)
            scores += tl.dot(q_rope, tl.trans(k_rope), input_precision=precision)
        visible = seen[None, :] & (rows[None, :] <= row_position[:, None]) & (rows[None, :] >= row_first[:, None])
        scores = tl.where(visible, scores * scale, float("-inf"))
        new_largest = tl.maximum(largest, tl.max(scores, axis=1))
        # a row that has seen no key yet (a block's earlier token, a window's start) subtracts 0, not -inf
        reference = tl.where(new_largest == float("-inf"), 0.0, new_largest)
        shrink = tl.exp(largest - reference)
        probs = tl.exp(scores - reference[:, None])
        acc = acc * shrink[:, None] + tl.dot(probs.to(v.dtype), v, input_precision=precision)
        total = total * shrink + tl.sum(probs, axis=1)
        largest = new_largest
    at = query * SPLITS + split
    tl.store(shares_ptr + at[:, None] * DIM + dim[None, :], acc, mask=real[:, None])
    tl.store(largest_ptr + at, largest, mask=real)
    tl.store(totals_ptr + at, total, mask=real)


@triton.jit
def _join_kernel(shares_ptr, largest_ptr, totals_ptr, sinks_ptr, position_ptr, out_ptr, tokens, heads, window,
                 HAS_SINKS: tl.constexpr, DIM: tl.constexpr, COLUMNS: tl.constexpr, SPLITS: tl.constexpr,
                 CHUNK: tl.constexpr, BLOCK_L: tl.constexpr, PDL: tl.constexpr):
    """A token's head's shares and sink -> COLUMNS of its output: each share rescaled to the largest score of all
    (some share holds the query's own row, so that is finite), CHUNK shares at a time up to the last that holds
    rows of any query; the shares a query sees nothing of add 0."""
    after_earlier_kernels(PDL)
    query = tl.program_id(0)  # token * heads + head: the row of the shares and of the output
    head = query % heads
    split, dim = tl.arange(0, SPLITS), tl.program_id(1) * COLUMNS + tl.arange(0, COLUMNS)
    largest = tl.load(largest_ptr + query * SPLITS + split)
    totals = tl.load(totals_ptr + query * SPLITS + split)
    overall = tl.max(largest, axis=0)
    if HAS_SINKS:
        sink = tl.load(sinks_ptr + head).to(tl.float32)
        overall = tl.maximum(overall, sink)
    total = tl.sum(totals * tl.exp(largest - overall), axis=0)  # empty shares: exp(-inf) = 0
    if HAS_SINKS:
        total += tl.exp(sink - overall)
    position, first, share = _share_rows(position_ptr, tokens, window, SPLITS, BLOCK_L)
    used = tl.cdiv(position + 1 - first, share)  # the shares past these are empty
    out = tl.zeros((COLUMNS,), tl.float32)
    for start in range(0, used, CHUNK):
        index = start + tl.arange(0, CHUNK)
        holds = index < used
        chunk = query * SPLITS + index
        weights = tl.exp(tl.load(largest_ptr + chunk, mask=holds, other=float("-inf")) - overall)
        rows = tl.load(shares_ptr + chunk[:, None] * DIM + dim[None, :], mask=holds[:, None], other=0.0)
        out += tl.sum(rows * weights[:, None], axis=0)
    tl.store(out_ptr + query * DIM + dim, (out / total).to(out_ptr.dtype.element_ty))
