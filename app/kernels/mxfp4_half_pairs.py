"""MXFP4 expert products for one token with bf16 activations (the decode step) on CUDA cores, two weights per
instruction: float16 pairs.

The float32 products of mxfp4_cuda_cores.py cost ~7 instructions per weight (sm_90 disassembly), so they are
issue-bound well above the HBM floor. Here an e2m1 code goes straight into the bits of a float16 with its
magnitude at bits 11..9 (the lowest two exponent bits and the highest mantissa bit) and its sign at 15: that
float16 is the e2m1 value times 2^-14, also for the code 0.5 (a float16 subnormal, which float16 arithmetic
keeps). One 32-bit word of 8 codes gives four float16 pairs with two shifts and two masks each: code p in the
low half and code p + 4 in the high half (p = 0..3), and one packed FMA (HFMA2) multiplies a pair with its two
inputs: 2.5 instructions per weight for decoding and multiplying, 3.3-5 with loads and addresses (sm_90
disassembly of the loop; ~7 for the float32 products). The packed FMA is inline PTX on a GPU (Triton's own
float16 arithmetic packs other elements together and shuffles the pairs apart); Triton's interpreter, which runs
no PTX, takes the same FMA on the halves (EMULATED), so the CUDA tests cover the PTX itself.

Each group's 32 products are summed in float16 (16 products per half), then in float32 times the group's
scale. So that float16 neither overflows nor loses small values, the inputs are scaled into [-2^14, 2^14]: the
hidden states by a power of two per token (`half_pairs`, from their largest magnitude), the activations between
gate_up and down by a fixed one (the clamped SwiGLU is bounded by (limit + 1) * limit). The inputs are stored
in pair order ([16, K/32, 2] per token: pair slot s = 4 w + p of word w, then the group, then the half), so that
a warp whose lanes take consecutive groups loads one 128-byte line per pair slot.
"""

import math
import os

import torch
import triton
import triton.language as tl

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
    _half_pairs_kernel[(tokens,)](x.contiguous(), pairs, unscale, k_size, BLOCK=triton.next_power_of_2(k_size),
                                  num_warps=8)
    return pairs, unscale


@triton.jit
def pair_order(columns, k_size):
    """Where input `columns` of a token's K inputs sit in pair order: [16, K/32, 2]."""
    group, within = columns // 32, columns % 32
    word, code = within // 8, within % 8
    return ((word * 4 + code % 4) * (k_size // 32) + group) * 2 + code // 4


@triton.jit
def _half_pairs_kernel(x_ptr, pairs_ptr, unscale_ptr, k_size, BLOCK: tl.constexpr):
    token = tl.program_id(0).to(tl.int64)
    columns = tl.arange(0, BLOCK)
    inside = columns < k_size
    x = tl.load(x_ptr + token * k_size + columns, mask=inside, other=0.0).to(tl.float32)
    # |x| < 2^(E - 126) for the largest |x|'s exponent field E: scale by 2^(140 - E), within 2^±100 (x all zero)
    field = (tl.max(tl.abs(x), axis=0).to(tl.int32, bitcast=True) >> 23) & 0xFF
    exponent = tl.minimum(tl.maximum(140 - field, -100), 100)
    scale = ((exponent + 127) << 23).to(tl.float32, bitcast=True)
    tl.store(pairs_ptr + token * k_size + pair_order(columns, k_size), (x * scale).to(tl.float16), mask=inside)
    tl.store(unscale_ptr + token, ((141 - exponent) << 23).to(tl.float32, bitcast=True))  # 2^(14 - exponent)


@triton.jit
def _code_pair(words, P: tl.constexpr):
    """Codes P (low half) and P + 4 (high half) of every uint32 in `words` -> the bits of float16 pairs, values
    times 2^-14."""
    if P == 3:
        bits = ((words >> 3) & 0x0E000E00) | (words & 0x80008000)
    else:
        bits = ((words << (9 - 4 * P)) & 0x0E000E00) | ((words << (12 - 4 * P)) & 0x80008000)
    return bits


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
def _step_weights(words_ptr, scale_ptr, words_at, scales_at, row_ok, group_ok):
    """A step's words [BLOCK_N, GROUPS, 4] uint32 and scale bytes [BLOCK_N, GROUPS] (0 where masked)."""
    w_ok = row_ok[:, None] & group_ok[None, :]
    words4 = tl.load(words_ptr + words_at, mask=w_ok[:, :, None], other=0).to(tl.uint32, bitcast=True)
    return words4, tl.load(scale_ptr + scales_at, mask=w_ok, other=0)


@triton.jit
def mxfp4_rows_times_half_pairs(pairs_ptr, words_ptr, scale_ptr, rows, n_size, k_size,
                                BLOCK_N: tl.constexpr, GROUPS: tl.constexpr):
    """W[rows, :] @ x -> [BLOCK_N] float32, before the inputs' unscaling. W is one expert's MXFP4 as uint32 words
    [N, K/8] + scales [N, K/32]; pairs_ptr points at one token's inputs in pair order (`half_pairs`) as uint32
    float16 pairs [16, K/32]; each step takes GROUPS groups of 32 inputs per row, and loads the next step's
    weights before it multiplies its own (their DRAM latency then overlaps this step's work: down 15.3 -> 13.9
    us on the H200 at T = 1, gate_up even)."""
    groups_total = k_size // 32
    row_ok = rows < n_size
    group = tl.arange(0, GROUPS)
    # lanes take groups: one 16-byte load per row brings a group's 4 words
    words_at = (rows[:, None, None] * groups_total + group[None, :, None]) * 4 + tl.arange(0, 4)
    scales_at = rows[:, None] * groups_total + group[None, :]
    pairs_at = group  # [GROUPS] of pair slot 0
    acc = tl.zeros((BLOCK_N, GROUPS), tl.float32)
    words4, scale_byte = _step_weights(words_ptr, scale_ptr, words_at, scales_at, row_ok, group < groups_total)
    for first in range(0, groups_total, GROUPS):
        group_ok = group < groups_total - first
        step_words, step_scales = words4, scale_byte
        words_at += GROUPS * 4
        scales_at += GROUPS
        words4, scale_byte = _step_weights(words_ptr, scale_ptr, words_at, scales_at, row_ok,
                                           group < groups_total - first - GROUPS)
        even, odd = tl.split(tl.reshape(step_words, (BLOCK_N, GROUPS, 2, 2)))  # words 0, 2 and 1, 3
        words0, words2 = tl.split(even)
        words1, words3 = tl.split(odd)
        sums = tl.zeros((BLOCK_N, GROUPS), tl.uint32)  # float16 pairs: a group's 16 products per half
        for word_index in tl.static_range(4):
            words = words0 if word_index == 0 else words1 if word_index == 1 else words2 if word_index == 2 else words3
            for p in tl.static_range(4):
                x = tl.load(pairs_ptr + pairs_at + (word_index * 4 + p) * groups_total, mask=group_ok, other=0)
                sums = _fma_pairs(_code_pair(words, p), x.to(tl.uint32, bitcast=True)[None, :], sums)
        low, high = _halves(sums)
        # scale byte s means 2^(s - 127): the float32 whose exponent field is s (0 -> 0.0)
        acc += (low + high) * (step_scales.to(tl.int32) << 23).to(tl.float32, bitcast=True)
        pairs_at += GROUPS
    return tl.sum(acc, axis=1)
