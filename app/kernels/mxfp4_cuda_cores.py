"""MXFP4 expert products for a few tokens (decode, short verify blocks) on CUDA cores, no MMA.

At decode a tile holds one or two (token, pick) pairs, so a matrix unit multiplies mostly padding
while the upcast of e2m1 to bf16 and its trip through shared memory cost ~7.6 instructions per weight
(bench/NOTES.md). Here each thread decodes a weight with four integer instructions straight into the
bits of a float32 and multiplies it with one FMA per pair (~6 instructions per weight in all, from
the sm_90 disassembly).

e2m1 -> float32: a code s|e e|m (sign, two exponent bits, one mantissa bit) is placed with its
magnitude bits at 24..22 (the lowest exponent bits and the highest mantissa bit) and its sign at 31.
That float is exactly the e2m1 value times 2^-126, also for the code 0.5 (a float32 denormal). The
activations are multiplied by 2^64 when loaded so that products stay far from the denormal range;
the group's scale 2^(s - 127) and 2^(126 - 64) are applied to the sum of its 32 products. The
activations are read as float32 in group-major order ([T, 32, K/32]: element j of 32 consecutive
groups is one 128-byte line for a warp whose lanes take groups), so loading them costs no conversion.

The grid is the caller's (tiles of pairs sharing a slot x blocks of output rows); inside a program
the lanes split the input depth, and the per-row sum across them happens once, after the loop.
"""

import torch
import triton
import triton.language as tl

X_SCALE = tl.constexpr(2.0**64)  # activations times this: e2m1 * 2^-126 * x stays normal for |x| >= 2^-60
UNSCALE = tl.constexpr(2.0**62)  # 2^(126 - 64)


@triton.jit
def _e2m1_times_2_pow_minus_126(words, NIBBLE: tl.constexpr):
    """Code NIBBLE (0 = lowest bits) of every uint32 in `words` -> float32 value * 2^-126."""
    placed = (words << (22 - 4 * NIBBLE)) if NIBBLE <= 5 else (words >> (4 * NIBBLE - 22))
    magnitude = placed & 0x01C00000
    sign = (words << (28 - 4 * NIBBLE)) & 0x80000000
    return (magnitude | sign).to(tl.float32, bitcast=True)


@triton.jit
def mxfp4_rows_times_inputs(
    x_ptr, inputs, used, words_ptr, scale_ptr, rows, n_size, k_size,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, GROUPS: tl.constexpr,
):
    """W[rows, :] @ x[inputs, :]^T -> [BLOCK_N, BLOCK_M] float32 (unused columns give 0).

    W is one expert's MXFP4 as uint32 words [N, K/8] (8 codes each, lowest bits first) + scales [N, K/32]; x is
    float32 times X_SCALE, stored group-major, [*, 32, K/32] (`group_major`); each step takes GROUPS groups
    of 32 inputs per row."""
    groups_total = k_size // 32
    row_ok = rows < n_size
    group = tl.arange(0, GROUPS)
    # lanes take groups: one 16-byte load per row brings a group's 4 words, and x's element j of 32
    # consecutive groups is one 128-byte line
    word = tl.arange(0, 4)
    words_at = (rows[:, None, None] * groups_total + group[None, :, None]) * 4 + word
    scales_at = rows[:, None] * groups_total + group[None, :]
    x_ptrs = x_ptr + inputs[:, None] * k_size + group[None, :]  # [BLOCK_M, GROUPS], element 0 of each group
    acc = tl.zeros((BLOCK_M, BLOCK_N, GROUPS), tl.float32)
    for first in range(0, groups_total, GROUPS):
        group_ok = group < groups_total - first
        w_ok = row_ok[:, None] & group_ok[None, :]
        x_ok = used[:, None] & group_ok[None, :]
        words4 = tl.load(words_ptr + words_at, mask=w_ok[:, :, None], other=0).to(tl.uint32, bitcast=True)  # [N,G,4]
        scale_byte = tl.load(scale_ptr + scales_at, mask=w_ok, other=0)
        even, odd = tl.split(tl.reshape(words4, (BLOCK_N, GROUPS, 2, 2)))  # words 0, 2 and 1, 3
        words0, words2 = tl.split(even)
        words1, words3 = tl.split(odd)
        sums = tl.zeros((BLOCK_M, BLOCK_N, GROUPS), tl.float32)
        for word_index in tl.static_range(4):
            words = words0 if word_index == 0 else words1 if word_index == 1 else words2 if word_index == 2 else words3
            for nibble in tl.static_range(8):
                weight = _e2m1_times_2_pow_minus_126(words, nibble)
                j = word_index * 8 + nibble
                x = tl.load(x_ptrs + j * groups_total, mask=x_ok, other=0.0)
                sums += weight[None, :, :] * x[:, None, :]
        # scale byte s means 2^(s - 127): the float32 whose exponent field is s (0 -> 0.0)
        scale = (scale_byte.to(tl.int32) << 23).to(tl.float32, bitcast=True)  # [BLOCK_N, GROUPS]
        acc += sums * scale[None, :, :]
        words_at += GROUPS * 4
        scales_at += GROUPS
        x_ptrs += GROUPS
    return tl.trans(tl.sum(acc, axis=2) * UNSCALE)


def group_major(x: torch.Tensor) -> torch.Tensor:
    """x [T, K] -> float32 [T, 32, K/32] times X_SCALE: element j of every group of 32 together, as
    `mxfp4_rows_times_inputs` reads it."""
    out = torch.empty((x.shape[0], 32, x.shape[1] // 32), dtype=torch.float32, device=x.device)
    return torch.mul(x.view(x.shape[0], -1, 32).transpose(1, 2), X_SCALE.value, out=out)  # one launch; exact
