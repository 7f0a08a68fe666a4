"""Split partial sums of a product added up, with the epilogues, in one launch: shares [S, T, N] float32 -> [T, N]
(SiLU(gate) * up [T, N / 2] with `glu`), plus a residual. Deterministic: no atomics, the shares added in order."""

import torch
import triton
import triton.language as tl

FINISH_BLOCK = 1024  # outputs per finishing program


def finish_shares(shares: torch.Tensor, dtype: torch.dtype, glu: bool, residual: torch.Tensor | None) -> torch.Tensor:
    """shares [S, T, N] float32 -> their sum [T, N] (SiLU(gate) * up [T, N / 2] with `glu`), plus residual, in
    `dtype`."""
    splits, tokens, features = shares.shape
    width = features // 2 if glu else features
    assert not glu or features % 2 == 0, "gate rows then as many up rows"
    assert residual is None or (residual.shape == (tokens, width) and residual.dtype == dtype)
    out = torch.empty((tokens, width), dtype=dtype, device=shares.device)
    residual = residual.contiguous() if residual is not None else None
    _finish_kernel[(tokens, triton.cdiv(width, FINISH_BLOCK))](
        shares, out if residual is None else residual, out, splits, tokens, features, width,
        GLU=glu, HAS_RESIDUAL=residual is not None, BLOCK=FINISH_BLOCK, num_warps=4,
    )
    return out


@triton.jit
def _finish_kernel(shares_ptr, residual_ptr, out_ptr, splits, tokens, features, width,
                   GLU: tl.constexpr, HAS_RESIDUAL: tl.constexpr, BLOCK: tl.constexpr):
    token = tl.program_id(0).to(tl.int64)
    column = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    inside = column < width
    y = tl.zeros((BLOCK,), tl.float32)
    up = tl.zeros((BLOCK,), tl.float32)
    for split in range(splits):
        row = shares_ptr + (split * tokens + token) * features
        y += tl.load(row + column, mask=inside, other=0.0)
        if GLU:
            up += tl.load(row + width + column, mask=inside, other=0.0)
    if GLU:
        y = y * tl.sigmoid(y) * up
    if HAS_RESIDUAL:
        y += tl.load(residual_ptr + token * width + column, mask=inside, other=0.0).to(tl.float32)
    tl.store(out_ptr + token * width + column, y.to(out_ptr.dtype.element_ty), mask=inside)
