"""MXFP4 expert products for one token with bf16 activations (the decode step) on CUDA cores, two weights per
instruction: float16 pairs.

The float32 products of mxfp4_cuda_cores.py cost ~7 instructions per weight (sm_90 disassembly), so they are
issue-bound well above the HBM floor. Here an e2m1 code goes straight into the bits of a float16 with its
magnitude at bits 11..9 (the lowest two exponent bits and the highest mantissa bit) and its sign at 15: that
float16 is the e2m1 value times 2^-14, also for the code 0.5 (a float16 subnormal, which float16 arithmetic
keeps). One 32-bit word of 8 codes gives four float16 pairs, code p in the low half and code p + 4 in the high half
(p = 0..3), with one shift and one mask each after two selects per word (`_code_pairs`); one packed FMA (HFMA2)
multiplies a pair with its two inputs: 15 instructions per 8 weights, 1.9 per weight (sm_90 disassembly; 19 with
two shifts and two masks a pair). The packed FMA and the selects are inline PTX on a GPU (Triton's own float16
arithmetic packs other elements together and shuffles the pairs apart; its selects take two masks); Triton's
interpreter, which runs no PTX, takes the same operations on the halves (EMULATED), so the CUDA tests cover the
PTX itself.

Each group's 32 products are summed in float16 (16 products per half), then in float32 times the group's
scale. So that float16 neither overflows nor loses small values, the inputs are scaled into [-2^14, 2^14]: the
hidden states by a power of two per token (`half_pairs`, from their largest magnitude), the activations between
gate_up and down by a fixed one (the clamped SwiGLU is bounded by (limit + 1) * limit). The inputs are stored
in pair order ([4, K/32, 4, 2] per token: word w of a group, the group, pair p of the word, the half), so that a lane
that takes a group reads its 16 pairs as four 16-byte loads, and each of those loads is 512 contiguous bytes over a
warp's lanes (in group-major order, [K/32, 16, 2], a load's lanes were 64 bytes apart: 16 cache lines a load, which
kept L1 busier than the weights did).
"""

import math
import os

import torch
import triton
import triton.language as tl

from app.kernels.dependent_launch import after_earlier_kernels, dependent_launch

EMULATED = tl.constexpr(os.environ.get("TRITON_INTERPRET") == "1")  # read when the kernels are defined
# inputs are scaled below 2^14: a group's float16 half-sums stay below 16 * 6 * 2^14 * 2^-14 = 96
LARGEST_INPUT_EXPONENT = 14


def activation_shift(limit: float) -> int:
    """The power of two that brings the clamped SwiGLU's largest magnitude, (limit + 1) * limit, to at most 2^14."""
    assert math.isfinite(limit) and limit > 0, "half pairs need the clamped SwiGLU's bound"
    return math.floor(LARGEST_INPUT_EXPONENT - math.log2((limit + 1) * limit))


def half_pairs(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """x [T, K] -> (float16 [T, K] in pair order, times 2^e per token, e such that every |x| * 2^e < 2^14;
    float32 [T] 2^(14 - e), what undoes the scaling of the inputs and of the weights' 2^-14)."""
    tokens, k_size = x.shape
    assert k_size % 32 == 0, "MXFP4 groups are 32 wide"
    pairs = torch.empty((tokens, k_size), dtype=torch.float16, device=x.device)
    unscale = torch.empty(tokens, dtype=torch.float32, device=x.device)
    _half_pairs_kernel[(tokens,)](x.contiguous(), pairs, unscale, K=k_size, BLOCK=triton.next_power_of_2(k_size),
                                  num_warps=8, **dependent_launch(x.device))
    return pairs, unscale


@triton.jit
def pair_order(columns, K: tl.constexpr):
    """Where input `columns` of a token's K inputs sit in pair order: [4, K/32, 4, 2] (word of the group, group, pair
    of the word, half)."""
    code = columns % 8
    word = (columns // 8) % 4
    return ((word * (K // 32) + columns // 32) * 4 + code % 4) * 2 + code // 4


@triton.jit
def _half_pairs_kernel(x_ptr, pairs_ptr, unscale_ptr, K: tl.constexpr, BLOCK: tl.constexpr, PDL: tl.constexpr):
    after_earlier_kernels(PDL)
    token = tl.program_id(0).to(tl.int64)
    columns = tl.arange(0, BLOCK)
    x = tl.load(x_ptr + token * K + columns, mask=columns < K, other=0.0).to(tl.float32)
    store_half_pairs(x, columns, pairs_ptr + token * K, unscale_ptr + token, K)


@triton.jit
def store_half_pairs(x, columns, pairs_ptr, unscale_ptr, K: tl.constexpr):
    """One token's inputs x [BLOCK] float32 at `columns` (0 past K) -> `half_pairs`'s row at pairs_ptr and its
    unscaling factor at unscale_ptr."""
    # |x| < 2^(E - 126) for the largest |x|'s exponent field E: scale by 2^(140 - E), within 2^±100 (x all zero)
    field = (tl.max(tl.abs(x), axis=0).to(tl.int32, bitcast=True) >> 23) & 0xFF
    exponent = tl.minimum(tl.maximum(140 - field, -100), 100)
    scale = ((exponent + 127) << 23).to(tl.float32, bitcast=True)
    tl.store(pairs_ptr + pair_order(columns, K), (x * scale).to(tl.float16), mask=columns < K)
    tl.store(unscale_ptr, ((141 - exponent) << 23).to(tl.float32, bitcast=True))  # 2^(14 - exponent)


@triton.jit
def _code_pairs(words):
    """Every uint32 of 8 codes in `words` -> its 4 float16 pairs (codes p and p + 4, p = 0..3) as uint32 bits,
    values times 2^-14. Code p's sign sits 3 bits above its magnitude in the word, 3 bits below it in a float16:
    two words that take the signs from the word shifted by 3 and the magnitudes from the word itself serve two
    pairs each (codes 0, 2 and 1, 3), so each pair costs one shift and one mask."""
    shifted = words << 3
    even = _select_even(words, shifted)
    odd = _select_odd(words, shifted)
    pair3 = (odd.to(tl.int32, bitcast=True) >> 3).to(tl.uint32, bitcast=True)  # brings code 7's sign down to 31
    return (even << 9) & 0x8E008E00, (odd << 5) & 0x8E008E00, (even << 1) & 0x8E008E00, pair3 & 0x8E008E00


@triton.jit
def _select_even(words, shifted):
    """The magnitudes of codes 0, 2, 4, 6 from `words`, the other bits (their signs 3 bits up) from `shifted`: one
    LOP3 (the compiler gives two for the masks and their complement)."""
    if EMULATED:
        return (words & 0x07070707) | (shifted & 0xF8F8F8F8)
    return tl.inline_asm_elementwise("lop3.b32 $0, $1, $2, 0x07070707, 0xE4;", "=r,r,r", [words, shifted],
                                     dtype=tl.uint32, is_pure=True, pack=1)


@triton.jit
def _select_odd(words, shifted):
    """The magnitudes of codes 1, 3, 5, 7 and code 7's sign (bit 31) from `words`, the other bits from `shifted`."""
    if EMULATED:
        return (words & 0xF0707070) | (shifted & 0x0F8F8F8F)
    return tl.inline_asm_elementwise("lop3.b32 $0, $1, $2, 0xF0707070, 0xE4;", "=r,r,r", [words, shifted],
                                     dtype=tl.uint32, is_pure=True, pack=1)


@triton.jit
def _halves(pairs):
    """uint32 float16 pairs -> (low, high) as float32."""
    low = (pairs & 0xFFFF).to(tl.uint16).to(tl.float16, bitcast=True)
    return low.to(tl.float32), (pairs >> 16).to(tl.uint16).to(tl.float16, bitcast=True).to(tl.float32)


@triton.jit
def _fma_pairs(a, b, c):
    """a * b + c on float16 pairs held as uint32 (one HFMA2 each)."""
    if EMULATED:
        low = tl.fma((a & 0xFFFF).to(tl.uint16).to(tl.float16, bitcast=True),
                     (b & 0xFFFF).to(tl.uint16).to(tl.float16, bitcast=True),
                     (c & 0xFFFF).to(tl.uint16).to(tl.float16, bitcast=True))
        high = tl.fma((a >> 16).to(tl.uint16).to(tl.float16, bitcast=True),
                      (b >> 16).to(tl.uint16).to(tl.float16, bitcast=True),
                      (c >> 16).to(tl.uint16).to(tl.float16, bitcast=True))
        return (low.to(tl.uint16, bitcast=True).to(tl.uint32)
                | (high.to(tl.uint16, bitcast=True).to(tl.uint32) << 16))
    return tl.inline_asm_elementwise("fma.rn.f16x2 $0, $1, $2, $3;", "=r,r,r,r", [a, b, c], dtype=tl.uint32,
                                     is_pure=True, pack=1)


@triton.jit
def _four(t):
    """[R, 32, 4] -> its four [R, 32] slices."""
    first, second = tl.split(tl.reshape(t, (t.shape[0], t.shape[1], 2, 2)))  # 0, 2 and 1, 3
    t0, t2 = tl.split(first)
    t1, t3 = tl.split(second)
    return t0, t1, t2, t3


@triton.jit
def _word_times_pairs(words, x4, sums):
    """sums + the 8 products of each word [R, 32] with its inputs x4 [R, 32, 4] (its 4 pairs), in float16 pairs."""
    x0, x1, x2, x3 = _four(x4)
    pair0, pair1, pair2, pair3 = _code_pairs(words)
    sums = _fma_pairs(pair0, x0, sums)
    sums = _fma_pairs(pair1, x1, sums)
    sums = _fma_pairs(pair2, x2, sums)
    return _fma_pairs(pair3, x3, sums)


@triton.jit
def _load(pointers, mask, FULL: tl.constexpr):
    if FULL:
        return tl.load(pointers)
    return tl.load(pointers, mask=mask, other=0)


@triton.jit
def _step_loads(words_ptr, scale_ptr, pairs_ptr, rows, N: tl.constexpr, GROUPS: tl.constexpr, BLOCK_N: tl.constexpr,
                STEP: tl.constexpr):
    """Step STEP's words [BLOCK_N, 32, 4] and scale bytes [BLOCK_N, 32], and the input pairs [BLOCK_N, 32, 4] of each
    of the groups' 4 words (uint32 but the scales; 0 past N and past the last group)."""
    group = STEP * 32 + tl.arange(0, 32)
    full: tl.constexpr = (STEP + 1) * 32 <= GROUPS
    word = STEP * 128 + tl.arange(0, 128)  # [32 groups, 4 words] flat: 128 contiguous words
    w_ok = (rows[:, None] < N) & (word[None, :] < GROUPS * 4)
    words = _load(words_ptr + rows[:, None] * (GROUPS * 4) + word[None, :], w_ok, full and N % BLOCK_N == 0)
    words4 = tl.reshape(words, (BLOCK_N, 32, 4))
    # a byte per lane: contiguous bytes would go to one lane, and then to the others through shared memory
    scales_at = tl.max_contiguous(rows[:, None] * GROUPS + group[None, :], [1, 1])
    scale = _load(scale_ptr + scales_at, (rows[:, None] < N) & (group[None, :] < GROUPS), full and N % BLOCK_N == 0)
    # the inputs as [1, 128] (a row's 128 words' pairs), broadcast over the rows: each lane loads its group's pairs
    # once for all its rows (as [BLOCK_N, 32, 4] Triton gave a lane two groups of one row, the other row's lanes
    # loading the same pairs again)
    pairs_at = pairs_ptr + word[None, :]
    x_ok = word[None, :] < GROUPS * 4
    x0 = _over_rows(_load(pairs_at, x_ok, full), BLOCK_N)
    x1 = _over_rows(_load(pairs_at + GROUPS * 4, x_ok, full), BLOCK_N)
    x2 = _over_rows(_load(pairs_at + GROUPS * 8, x_ok, full), BLOCK_N)
    x3 = _over_rows(_load(pairs_at + GROUPS * 12, x_ok, full), BLOCK_N)
    return words4.to(tl.uint32, bitcast=True), scale, x0, x1, x2, x3


@triton.jit
def _over_rows(pairs, BLOCK_N: tl.constexpr):
    """One step's inputs [1, 128] as every row's [BLOCK_N, 32 groups, 4 words]."""
    return tl.reshape(tl.broadcast_to(pairs, (BLOCK_N, 128)), (BLOCK_N, 32, 4))


@triton.jit
def _step_products(words4, scale, x0, x1, x2, x3, acc):
    """acc [BLOCK_N, 32] + each lane's group sums of a step, in float32 times the groups' scales."""
    words0, words1, words2, words3 = _four(words4)
    sums = tl.zeros(acc.shape, tl.uint32)  # float16 pairs: a group's 16 products per half
    sums = _word_times_pairs(words0, x0.to(tl.uint32, bitcast=True), sums)
    sums = _word_times_pairs(words1, x1.to(tl.uint32, bitcast=True), sums)
    sums = _word_times_pairs(words2, x2.to(tl.uint32, bitcast=True), sums)
    sums = _word_times_pairs(words3, x3.to(tl.uint32, bitcast=True), sums)
    low, high = _halves(sums)
    # scale byte s means 2^(s - 127): the float32 whose exponent field is s (0 -> 0.0)
    return acc + (low + high) * (scale.to(tl.int32) << 23).to(tl.float32, bitcast=True)


@triton.jit
def mxfp4_rows_times_half_pairs(pairs_ptr, words_ptr, scale_ptr, rows, N: tl.constexpr, K: tl.constexpr,
                                BLOCK_N: tl.constexpr):
    """W[rows, :] @ x -> [BLOCK_N] float32, before the inputs' unscaling. W is one expert's MXFP4 as uint32 words
    [N, K/8] + scales [N, K/32]; pairs_ptr points at one token's inputs in pair order (`half_pairs`) as uint32
    float16 pairs [4, K/32, 4]. The lanes of a warp take 32 groups at a time, all of K in at most 4 unrolled steps,
    with masks only on the last step's groups past K (and on rows past N); a lane reads a row's group as one
    16-byte load, its 16 input pairs as four."""
    GROUPS: tl.constexpr = K // 32
    STEPS: tl.constexpr = triton.cdiv(GROUPS, 32)
    tl.static_assert(STEPS <= 4, "K up to 4096")
    a0, a1, a2, a3, a4, a5 = _step_loads(words_ptr, scale_ptr, pairs_ptr, rows, N, GROUPS, BLOCK_N, 0)
    if STEPS > 1:
        b0, b1, b2, b3, b4, b5 = _step_loads(words_ptr, scale_ptr, pairs_ptr, rows, N, GROUPS, BLOCK_N, 1)
    if STEPS > 2:
        c0, c1, c2, c3, c4, c5 = _step_loads(words_ptr, scale_ptr, pairs_ptr, rows, N, GROUPS, BLOCK_N, 2)
    if STEPS > 3:
        d0, d1, d2, d3, d4, d5 = _step_loads(words_ptr, scale_ptr, pairs_ptr, rows, N, GROUPS, BLOCK_N, 3)
    # ptxas still issues a step's words while the step before multiplies and the scales after the products (SASS);
    # the barrier is what the H200 figures were measured with (bench/NOTES.md: forcing the order did not pay)
    tl.debug_barrier()
    acc = _step_products(a0, a1, a2, a3, a4, a5, tl.zeros((BLOCK_N, 32), tl.float32))
    if STEPS > 1:
        acc = _step_products(b0, b1, b2, b3, b4, b5, acc)
    if STEPS > 2:
        acc = _step_products(c0, c1, c2, c3, c4, c5, acc)
    if STEPS > 3:
        acc = _step_products(d0, d1, d2, d3, d4, d5, acc)
    return tl.sum(acc, axis=1)
