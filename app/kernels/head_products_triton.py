"""head_products.py's products in one Triton kernel on CUDA cores: a program per (token, head, block of BLOCK_N
weight rows) multiplies its rows by the head's inputs in unrolled steps of BLOCK_K (float32 sums, reduced across
the row once at the end); with a rotated tail, one more program per (token, head) rotates the head's last inputs
into the columns after the products."""

import torch
import triton
import triton.language as tl

from app.kernels.dependent_launch import after_earlier_kernels, dependent_launch
from app.kernels.rotation_triton import rotated

ROWS, DEPTH = 32, 128  # weight rows a program, inputs a step (at most)


def run_head_products(
    x: torch.Tensor, weight: torch.Tensor, cos: torch.Tensor | None, sin: torch.Tensor | None, interleaved: bool,
) -> torch.Tensor:
    """x [T, heads, K + R], weight [heads, N, K], cos/sin [T, R / 2] or None -> [T, heads, N + R]."""
    tokens, heads, width = x.shape
    _, rows, inputs = weight.shape
    rope = 0 if cos is None else 2 * cos.shape[1]
    assert weight.shape[0] == heads and width == inputs + rope and x.stride(2) == 1 and weight.is_contiguous()
    assert cos is None or cos.shape == sin.shape == (tokens, rope // 2)
    out = torch.empty((tokens, heads, rows + rope), dtype=x.dtype, device=x.device)
    blocks = triton.cdiv(rows, ROWS)
    _head_products_kernel[(tokens, heads, blocks + (rope > 0))](
        x, weight, x if cos is None else cos.contiguous(), x if sin is None else sin.contiguous(), out,
        x.stride(0), x.stride(1), heads, N=rows, K=inputs, ROPE=rope, BLOCK_N=ROWS,
        BLOCK_K=min(DEPTH, triton.next_power_of_2(inputs)), ROPE_BLOCK=triton.next_power_of_2(max(rope, 1)),
        INTERLEAVED=interleaved, num_warps=4, **dependent_launch(x.device),
    )
    return out


@triton.jit
def _rows_times_inputs(x_ptr, w_ptr, out_ptr, block, N: tl.constexpr, K: tl.constexpr, BLOCK_N: tl.constexpr,
                       BLOCK_K: tl.constexpr):
    """out[rows] = w[rows, :K] @ x[:K] for this block's rows of one head's [N, K] weight."""
    rows = block * BLOCK_N + tl.arange(0, BLOCK_N)
    row_ok = rows < N
    w_rows = w_ptr + rows.to(tl.int64)[:, None] * K
    total = tl.zeros((BLOCK_N, BLOCK_K), dtype=tl.float32)
    for start in tl.static_range(0, K, BLOCK_K):
        columns = start + tl.arange(0, BLOCK_K)
        column_ok = columns < K
        w = tl.load(w_rows + columns[None, :], mask=row_ok[:, None] & column_ok[None, :], other=0.0)
        inputs = tl.load(x_ptr + columns, mask=column_ok, other=0.0).to(tl.float32)
        total += w.to(tl.float32) * inputs[None, :]
    tl.store(out_ptr + rows, tl.sum(total, axis=1).to(out_ptr.dtype.element_ty), mask=row_ok)


@triton.jit
def _head_products_kernel(x_ptr, w_ptr, cos_ptr, sin_ptr, out_ptr, token_stride, head_stride, heads,
                          N: tl.constexpr, K: tl.constexpr, ROPE: tl.constexpr, BLOCK_N: tl.constexpr,
                          BLOCK_K: tl.constexpr, ROPE_BLOCK: tl.constexpr, INTERLEAVED: tl.constexpr,
                          PDL: tl.constexpr):
    after_earlier_kernels(PDL)
    token, head, block = tl.program_id(0).to(tl.int64), tl.program_id(1), tl.program_id(2)
    x_row = x_ptr + token * token_stride + head * head_stride
    out_row = out_ptr + (token * heads + head) * (N + ROPE)
    if block < tl.cdiv(N, BLOCK_N):
        _rows_times_inputs(x_row, w_ptr + head.to(tl.int64) * N * K, out_row, block, N, K, BLOCK_N, BLOCK_K)
    elif ROPE > 0:
        rope_dims, inside = rotated(x_row + K, cos_ptr, sin_ptr, token, ROPE, ROPE_BLOCK, INTERLEAVED)
        tl.store(out_row + N + tl.arange(0, ROPE_BLOCK), rope_dims.to(out_ptr.dtype.element_ty), mask=inside)
