"""MXFP4 expert products for one token on the matrix units: 16 rows a warp, one mma.sync m16n8k16 (float16 in,
float32 sums) per 256 weights.

The float16 pairs of mxfp4_half_pairs.py multiply on CUDA cores with one HFMA2 per pair, and each one-warp program
pays its table lookups, scales, lane sums and epilogue for two rows: 3.04 instructions a weight on sm_90, which on
the H200 issue for longer than the weights take to arrive (bench/NOTES.md). Here a warp holds 16 rows as the A
operand of an MMA whose B columns all hold the token's inputs: the same decoding into float16 pairs (`code_pairs`),
then one MMA per two pairs of 16 rows instead of 16 HFMA2, no lane sums (the MMA sums a row's lanes) and the
per-program work paid once per 16 rows.

Lanes are the MMA's fragments: a [32 * WARPS] tensor holds one value per thread (element i in warp i // 32, lane
i % 32; the loads carry max_contiguous hints so that Triton keeps that layout). Lane (r, q) = (i % 32 // 4, i % 4)
holds rows r and r + 8 of the tile; for an MXFP4 group of 32 inputs it decodes word q of both rows into 4 float16
pairs each (codes p, p + 4) and loads the same word's 4 input pairs, which `half_pairs` stores together. The MMA's
k slots 2q, 2q + 1 (and + 8) are then codes of word q in both operands, so each MMA sums 16 of a group's 32
products per row; two MMAs make the group, times its scale in float32. The warps of a program take every WARPS-th
group and add their sums at the end. Triton's interpreter runs no PTX: there the MMA is the same sum in tensor
operations (EMULATED), so the CUDA tests cover the PTX itself.
"""

import triton
import triton.language as tl

from app.kernels.mxfp4_half_pairs import EMULATED, code_pairs, four, halves, load_unless_full

ROWS = tl.constexpr(16)  # rows of a tile: the MMA's M


@triton.jit
def _mma_rows(a0, a1, a2, a3, b0, b1, c0, c1, c2, c3):
    """One m16n8k16 MMA over each warp's lanes: A's fragments a0..a3 (float16 pairs as uint32: rows r, r + 8 at k
    slots 2q, 2q + 1, then rows r, r + 8 at 2q + 8, 2q + 9), B's b0, b1 (the inputs at those k slots, the same in
    every column), C's c0..c3 (float32: rows r, r, r + 8, r + 8 at columns 2q, 2q + 1) -> D = C + A B. B's columns
    are all alike, so D's are too: d0 = d1 is row r's sum, d2 = d3 row r + 8's, in every lane of the row. (Passing
    c0 for c1 would cost ptxas a copy a product.)"""
    if EMULATED:
        a0_low, a0_high = halves(a0)
        a1_low, a1_high = halves(a1)
        a2_low, a2_high = halves(a2)
        a3_low, a3_high = halves(a3)
        b0_low, b0_high = halves(b0)
        b1_low, b1_high = halves(b1)
        part_r = _over_quad(a0_low * b0_low + a0_high * b0_high + a2_low * b1_low + a2_high * b1_high)
        part_r8 = _over_quad(a1_low * b0_low + a1_high * b0_high + a3_low * b1_low + a3_high * b1_high)
        return c0 + part_r, c1 + part_r, c2 + part_r8, c3 + part_r8
    return tl.inline_asm_elementwise(
        "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {$0, $1, $2, $3}, {$4, $5, $6, $7}, {$8, $9}, "
        "{$10, $11, $12, $13};",
        "=f,=f,=f,=f,r,r,r,r,r,r,f,f,f,f", [a0, a1, a2, a3, b0, b1, c0, c1, c2, c3],
        dtype=(tl.float32, tl.float32, tl.float32, tl.float32), is_pure=True, pack=1)


@triton.jit
def _over_quad(part):
    """[L] -> each lane's sum over the 4 lanes of its quad (lanes 4j .. 4j + 3), as the MMA sums a row's k slots."""
    quads: tl.constexpr = part.shape[0] // 4
    sums = tl.sum(tl.reshape(part, (quads, 4)), axis=1)
    return tl.reshape(tl.broadcast_to(sums[:, None], (quads, 4)), (part.shape[0],))


@triton.jit
def _lanes(pairs, LANES: tl.constexpr):
    """[1, L] int32 -> [L] uint32."""
    return tl.reshape(pairs, (LANES,)).to(tl.uint32, bitcast=True)


@triton.jit
def _group_loads(words_r, words_r8, scales_r, scales_r8, pairs, ok, FULL: tl.constexpr):
    """A group's loads: each lane's word of the group in rows r and r + 8 (words_r, words_r8 [L]) as uint32, their
    scale bytes, and the word's 4 input pairs (pairs [1, L, 4], one 16-byte load) as 4 [L] uint32; 0 where not `ok`."""
    x0, x1, x2, x3 = four(load_unless_full(pairs, ok[None, :, None], FULL))
    lanes: tl.constexpr = ok.shape[0]
    return (load_unless_full(words_r, ok, FULL).to(tl.uint32, bitcast=True),
            load_unless_full(words_r8, ok, FULL).to(tl.uint32, bitcast=True),
            load_unless_full(scales_r, ok, FULL), load_unless_full(scales_r8, ok, FULL),
            _lanes(x0, lanes), _lanes(x1, lanes), _lanes(x2, lanes), _lanes(x3, lanes))


@triton.jit
def _group_products(loaded, sums_r, sums_r8):
    """sums_r, sums_r8 [L] + a group's products of rows r and r + 8 (`_group_loads`), times its scale."""
    words_r, words_r8, scale_r, scale_r8, x0, x1, x2, x3 = loaded
    r0, r1, r2, r3 = code_pairs(words_r)
    s0, s1, s2, s3 = code_pairs(words_r8)
    zero = tl.zeros_like(sums_r)
    d0, d1, d2, d3 = _mma_rows(r0, s0, r1, s1, x0, x1, zero, zero, zero, zero)
    group_r, _, group_r8, _ = _mma_rows(r2, s2, r3, s3, x2, x3, d0, d1, d2, d3)
    # scale byte s means 2^(s - 127): the float32 whose exponent field is s (0 -> 0.0)
    sums_r += group_r * (scale_r.to(tl.int32) << 23).to(tl.float32, bitcast=True)
    return sums_r, sums_r8 + group_r8 * (scale_r8.to(tl.int32) << 23).to(tl.float32, bitcast=True)


@triton.jit
def _step_loads(at, step: tl.constexpr, WARPS: tl.constexpr, GROUPS: tl.constexpr, STEPS: tl.constexpr):
    """`_group_loads` of step `step` from step 0's addresses `at` (and each lane's warp), masked off past the last
    step and past the last group."""
    words_r, words_r8, scales_r, scales_r8, pairs, warp = at
    return _group_loads(words_r + 4 * WARPS * step, words_r8 + 4 * WARPS * step, scales_r + WARPS * step,
                        scales_r8 + WARPS * step, pairs + 4 * WARPS * step, warp < GROUPS - WARPS * step,
                        GROUPS % WARPS == 0 and step < STEPS)


@triton.jit
def mxfp4_tile_times_half_pairs(pairs_ptr, words_ptr, scale_ptr, rows_r, rows_r8, N: tl.constexpr, K: tl.constexpr,
                                WARPS: tl.constexpr, AHEAD: tl.constexpr):
    """Rows rows_r and rows_r8 ([32 * WARPS] as lanes: r = lane % 32 // 4, the same in every warp) of W @ x ->
    two [32] float32 (lane r * 4 + q holds the sums of its rows), before the inputs' unscaling. W is one expert's
    MXFP4 as uint32 words [N, K/8] + scales [N, K/32]; pairs_ptr points at one token's inputs in pair order
    (`half_pairs`) as uint32 float16 pairs [4, K/32, 4]. Warp w takes groups w, w + WARPS, ...: all of K unrolled,
    masks only where WARPS does not divide K/32. A step's loads are issued AHEAD steps before its products (1: just
    before, where ptxas places them)."""
    GROUPS: tl.constexpr = K // 32
    STEPS: tl.constexpr = triton.cdiv(GROUPS, WARPS)
    tl.static_assert(N % ROWS.value == 0, "MXFP4 rows come in multiples of 32")
    lane = tl.arange(0, 32 * WARPS)
    warp, q = lane // 32, lane % 4
    # step 0's addresses (group = warp); a step adds constants to them. A lane reads word q of its rows' group (the
    # 4 lanes of a quad a row's 16 contiguous bytes), its scale bytes, and the 4 input pairs of that word.
    words_r = words_ptr + tl.max_contiguous((rows_r * GROUPS + warp) * 4 + q, [1])
    words_r8 = words_ptr + tl.max_contiguous((rows_r8 * GROUPS + warp) * 4 + q, [1])
    scales_r = scale_ptr + tl.max_contiguous(rows_r * GROUPS + warp, [1])
    scales_r8 = scale_ptr + tl.max_contiguous(rows_r8 * GROUPS + warp, [1])
    pairs = pairs_ptr + ((q * GROUPS + warp) * 4)[None, :, None] + tl.arange(0, 4)[None, None, :]
    sums_r = tl.zeros((32 * WARPS,), tl.float32)
    sums_r8 = tl.zeros((32 * WARPS,), tl.float32)
    at = (words_r, words_r8, scales_r, scales_r8, pairs, warp)
    if AHEAD == 1:
        for step in tl.static_range(STEPS):
            loaded = _step_loads(at, step, WARPS, GROUPS, STEPS)
            sums_r, sums_r8 = _group_products(loaded, sums_r, sums_r8)
    else:
        window = ()  # the loads of the next AHEAD steps (past the last step, masked off)
        for step in tl.static_range(AHEAD):
            window = window + (_step_loads(at, step, WARPS, GROUPS, STEPS),)  # noqa: RUF005 (Triton takes no *)
        for step in tl.static_range(STEPS):
            loaded = window[0]
            window = window[1:] + (_step_loads(at, step + AHEAD, WARPS, GROUPS, STEPS),)  # noqa: RUF005
            sums_r, sums_r8 = _group_products(loaded, sums_r, sums_r8)
    return tl.sum(tl.reshape(sums_r, (WARPS, 32)), axis=0), tl.sum(tl.reshape(sums_r8, (WARPS, 32)), axis=0)
