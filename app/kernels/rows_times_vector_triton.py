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
        return dict(BLOCK_N=self.rows, BLOCK_K=self.depth, FOLD=self.fold, WARPS=self.warps, num_warps=self.warps,
                    **capped)


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
                      BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, FOLD: tl.constexpr, WARPS: tl.constexpr):
    """x [K] (any float dtype) times the K weights from each of the pointers w_rows [BLOCK_N] -> [BLOCK_N] float32,
    scaled as `weight_rows` says; WARPS: the launch's warps."""
    channel = _channel_scales(scales, SCALES)
    products = _thread_products(x_ptr, w_rows, scales, K, SCALES, SCALE_COLS, BLOCK_N, BLOCK_K, FOLD, WARPS)
    return tl.sum(products, axis=1) * channel


@triton.jit
def gated_rows_times_vector(x_ptr, gate_rows, gate_scales, up_rows, up_scales, K: tl.constexpr, SCALES: tl.constexpr,
                            SCALE_COLS: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                            FOLD: tl.constexpr, WARPS: tl.constexpr):
    """SiLU(gate) * up [BLOCK_N] float32 for the gate rows and up rows of `weight_rows`. Both rows' sums come after
    both rows' products: a sum across warps waits at a barrier, which the up rows' loads would otherwise wait
    behind (sm_90 SASS)."""
    gate_channel, up_channel = _channel_scales(gate_scales, SCALES), _channel_scales(up_scales, SCALES)
    gate = _thread_products(x_ptr, gate_rows, gate_scales, K, SCALES, SCALE_COLS, BLOCK_N, BLOCK_K, FOLD, WARPS)
    up = _thread_products(x_ptr, up_rows, up_scales, K, SCALES, SCALE_COLS, BLOCK_N, BLOCK_K, FOLD, WARPS)
    gate = tl.sum(gate, axis=1) * gate_channel
    return gate * tl.sigmoid(gate) * tl.sum(up, axis=1) * up_channel


@triton.jit
def _channel_scales(scales, SCALES: tl.constexpr):
    """The rows' scales per channel (1 for other scales), loaded before the products: after the sums' barrier their
    load would wait a round trip of its own (sm_90 SASS)."""
    channel = 1.0
    if SCALES == 1:
        channel = tl.load(scales).to(tl.float32)
    return channel


@triton.jit
def _thread_products(x_ptr, w_rows, scales, K: tl.constexpr, SCALES: tl.constexpr, SCALE_COLS: tl.constexpr,
                     BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, FOLD: tl.constexpr, WARPS: tl.constexpr):
    """x times each row's weights, summed by each thread: [BLOCK_N, BLOCK_K / FOLD] float32, block scales applied."""
    depth = tl.arange(0, BLOCK_K)
    acc = tl.zeros((BLOCK_N, BLOCK_K // FOLD), tl.float32)
    # 16-byte loads of inputs a 16-byte load of weights needs: 2 for FP8 weights and 16-bit inputs
    PIECES: tl.constexpr = x_ptr.dtype.element_ty.primitive_bitwidth // w_rows.dtype.element_ty.primitive_bitwidth
    for k0 in tl.static_range(0, K, BLOCK_K):
        x = _step_inputs(x_ptr, scales, k0, K, SCALES, SCALE_COLS, BLOCK_N, BLOCK_K, WARPS, PIECES, k0 + BLOCK_K <= K)
        if k0 + BLOCK_K <= K:
            w = tl.load(w_rows[:, None] + k0 + depth[None, :])
        else:
            w = tl.load(w_rows[:, None] + k0 + depth[None, :], mask=depth[None, :] < K - k0, other=0.0)
        products = weights_as(w, tl.float32) * x
        if FOLD > 1:
            products = tl.sum(tl.reshape(products, (BLOCK_N, BLOCK_K // FOLD, FOLD)), axis=2)
        acc += products
    return acc


@triton.jit
def _step_inputs(x_ptr, scales, k0, K: tl.constexpr, SCALES: tl.constexpr, SCALE_COLS: tl.constexpr,
                 BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, WARPS: tl.constexpr, PIECES: tl.constexpr,
                 FULL: tl.constexpr):
    """The step's inputs x[k0 : k0 + BLOCK_K] as float32 (0 past K) times their block scales, for every row:
    [BLOCK_N, BLOCK_K], where a thread's 16 bytes of weights want them.

    As [BLOCK_K] Triton gives a thread 16 bytes of inputs, 8 where a thread holds 16 FP8 weights, and moves them
    through shared memory every step, each time behind a barrier that the next step's loads wait for (sm_90 SASS).
    So with 2 pieces a thread loads its 16 inputs as two runs of 8 and their block scale once (16 inputs never
    straddle a block column), as [ROW_WARPS, BLOCK_K / 16, 8]: Triton lays the weights out with 32 threads a warp
    along K until K runs out of 16-byte runs, the other warps along the rows (row r on warp r % ROW_WARPS), and so
    these inputs, a copy for each warp that holds rows. A one-warp program has no barrier to lose and keeps the
    [BLOCK_K] inputs: the runs of 8 cost it registers, and q/k/v's 21.5 us took 24.6 (H100, bench NOTES)."""
    per_input_scales: tl.constexpr = SCALES == 2 and SCALE_COLS % BLOCK_K != 0
    if PIECES == 2 and WARPS > 1:
        K_WARPS: tl.constexpr = max(1, min(WARPS, BLOCK_K // 512))
        ROW_WARPS: tl.constexpr = min(WARPS // K_WARPS, BLOCK_N)
        starts = tl.broadcast_to(tl.arange(0, BLOCK_K // 16)[:, None, None] * 16, (BLOCK_K // 16, ROW_WARPS, 1))
        runs = starts + tl.arange(0, 8)[None, None, :]
        if FULL:
            low = tl.load(x_ptr + k0 + runs).to(tl.float32)
            high = tl.load(x_ptr + k0 + 8 + runs).to(tl.float32)
        else:
            low = tl.load(x_ptr + k0 + runs, mask=runs < K - k0, other=0.0).to(tl.float32)
            high = tl.load(x_ptr + k0 + 8 + runs, mask=runs + 8 < K - k0, other=0.0).to(tl.float32)
        if per_input_scales:
            scale = tl.load(scales + (k0 + starts) // SCALE_COLS, mask=starts < K - k0, other=0.0).to(tl.float32)
            low, high = low * scale, high * scale
        x = tl.reshape(tl.permute(tl.join(low, high), (1, 0, 3, 2)), (1, ROW_WARPS, BLOCK_K))
        x = tl.reshape(tl.broadcast_to(x, (BLOCK_N // ROW_WARPS, ROW_WARPS, BLOCK_K)), (BLOCK_N, BLOCK_K))
    else:
        depth = tl.arange(0, BLOCK_K)
        if FULL:
            x = tl.load(x_ptr + k0 + depth).to(tl.float32)
        else:
            x = tl.load(x_ptr + k0 + depth, mask=depth < K - k0, other=0.0).to(tl.float32)
        if per_input_scales:
            x = x * tl.load(scales + (k0 + depth) // SCALE_COLS, mask=depth < K - k0, other=0.0).to(tl.float32)
        x = tl.broadcast_to(x[None, :], (BLOCK_N, BLOCK_K))
    if SCALES == 2 and SCALE_COLS % BLOCK_K == 0:
        x = x * tl.load(scales + k0 // SCALE_COLS).to(tl.float32)
    return x
