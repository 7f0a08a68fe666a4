"""Measured curves read between their points (pure Python)."""

from itertools import pairwise


def interpolated(curve: list[tuple[float, float]], x: float) -> float:
    """The value at `x` on the straight lines through `curve`'s (x, y) points, x ascending: the first point's y
    before it, the last point's beyond it."""
    for (x0, y0), (x1, y1) in pairwise(curve):
        if x <= x1:
            return y0 + (y1 - y0) * (max(x, x0) - x0) / (x1 - x0) if x1 > x0 else y1
    return curve[-1][1]
