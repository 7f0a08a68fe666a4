"""Weight rows times one vector on CUDA cores: the single-token (decode) products of FP8 and 16-bit weights.

At one token a product reads every weight once and multiplies it once, so it is bound by DRAM's latency and
bandwidth; tensor-core tiles pad the token side to 16 and stage the weights through shared memory for nothing.
Here a program takes `rows` whole rows in unrolled steps of `depth` inputs (K is a constexpr: the compiler sees
every step, so the loads of later steps can go out before the products of earlier ones, and only a tail step is
masked); each weight is converted in registers to float32 and multiplied by its input. A thread adds its products
in runs of `fold` inputs before they join a [rows, depth / fold] float32 sum, which is reduced across the row once,
at the end. At fold 1 that sum takes four registers for each register of a step's FP8 weights, which limits the
weights a thread can have in flight (the sweep in bench/NOTES.md).

Scales: one per output channel multiplies a row's sum; a block scale multiplies the step's inputs (one load a step
where the step lies inside one block column, else each input's own), since a program's rows lie inside one block
row (`rows` divides its height, programs start at multiples of `rows`).
"""

import math
from dataclasses import dataclass, replace

import triton
import triton.language as tl

from app.kernels.fp8_bytes import weights_as


@dataclass(frozen=True)
class RowTiles:
    """A single-token launch: rows per program, inputs per step, warps per program, products a thread adds first,
    and at most this many registers a thread (None: ptxas's choice; fewer leave room for more programs an SM)."""

    rows: int
    depth: int
    warps: int = 1
    fold: int = 1
    registers: int | None = None

    def within(self, block_rows: int) -> "RowTiles":
        """These tiles with at most `block_rows` rows a program, dividing it (a block row of scales)."""
        return replace(self, rows=math.gcd(self.rows, block_rows))

    def for_element_size(self, element_size: int) -> "RowTiles":
        """These tiles (measured on FP8) for weights of `element_size` bytes: as many bytes a step, so fewer inputs."""
        return replace(self, depth=self.depth // element_size)

    def constants(self) -> dict:
        capped = {} if self.registers is None else {"maxnreg": self.registers}
        return dict(BLOCK_N=self.rows, BLOCK_K=self.depth, FOLD=self.fold, num_warps=self.warps, **capped)


@triton.jit
def weight_rows(weight_ptr, scale_ptr, rows, first_row, K: tl.constexpr,
                SCALES: tl.constexpr, SCALE_ROWS: tl.constexpr, SCALE_COLS: tl.constexpr):
    """What `rows_times_vector` takes for `rows` (whose first is `first_row`) of one [N, K] weight and its scales:
    the rows' pointers, and each row's scale (per channel), the pointer of the block row's scales (per block) or
    nothing."""
    w_rows = weight_ptr + rows.to(tl.int64) * K
    if SCALES == 1:
        return w_rows, scale_ptr + rows
    elif SCALES == 2:
        return w_rows, scale_ptr + (first_row // SCALE_ROWS) * tl.cdiv(K, SCALE_COLS)
    else:
        return w_rows, scale_ptr


@triton.jit
def rows_times_vector(x_ptr, w_rows, scales, K: tl.constexpr, SCALES: tl.constexpr, SCALE_COLS: tl.constexpr,
                      BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, FOLD: tl.constexpr):
    """x [K] (any float dtype) times the K weights from each of the pointers w_rows [BLOCK_N] -> [BLOCK_N] float32,
    scaled as `weight_rows` says."""
    depth = tl.arange(0, BLOCK_K)
    acc = tl.zeros((BLOCK_N, BLOCK_K // FOLD), tl.float32)
    for k0 in tl.static_range(0, K, BLOCK_K):
        if k0 + BLOCK_K <= K:
            x = tl.load(x_ptr + k0 + depth).to(tl.float32)
            w = tl.load(w_rows[:, None] + k0 + depth[None, :])
        else:
            inside = depth < K - k0
            x = tl.load(x_ptr + k0 + depth, mask=inside, other=0.0).to(tl.float32)
            w = tl.load(w_rows[:, None] + k0 + depth[None, :], mask=inside[None, :], other=0.0)
        if SCALES == 2:
            if SCALE_COLS % BLOCK_K == 0:
                x = x * tl.load(scales + k0 // SCALE_COLS).to(tl.float32)
            else:
                x = x * tl.load(scales + (k0 + depth) // SCALE_COLS, mask=k0 + depth < K, other=0.0).to(tl.float32)
        products = weights_as(w, tl.float32) * x[None, :]
        if FOLD > 1:
            products = tl.sum(tl.reshape(products, (BLOCK_N, BLOCK_K // FOLD, FOLD)), axis=2)
        acc += products
    sums = tl.sum(acc, axis=1)
    if SCALES == 1:
        sums = sums * tl.load(scales).to(tl.float32)
    return sums
