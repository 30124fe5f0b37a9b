"""The ``isotonic`` calibration map fitted in plain numpy and Python: a monotone step-wise map of
confidence to the chance of being right, as the points it interpolates between.

It is scikit-learn's ``IsotonicRegression(y_min=0.0, y_max=1.0, increasing=True,
out_of_bounds="clip").fit(x, y)`` re-done, its ``X_thresholds_`` and ``y_thresholds_`` to the bit
(``tests/unit/test_folds_oracle.py`` holds them to scikit-learn): sort by x (ties by y), merge x
closer than float64's resolution into one point (the weighted mean of its y), pool adjacent
violators (scipy's ``optimize.isotonic_regression``, Busing 2022, the same arithmetic in the same
order), clip to [0, 1], drop interior points equal to both neighbours. Importing scikit-learn
costs a run about two CPU seconds; bit-equal points keep every held-out score, and so the method
calibration chooses, as it was.

Example::

    x, y = isotonic_points(confidence, correct)
    np.interp(new_confidence, x, y)     # what Calibration.apply does with them
"""

from __future__ import annotations

import numpy as np
from numpy.typing import ArrayLike, NDArray

__all__ = ["isotonic_points"]

#: scikit-learn's ``_make_unique`` merges an x into the current point while it is less than this
#: above the point's first x (np.finfo(np.float64).resolution).
RESOLUTION = float(np.finfo(np.float64).resolution)


def isotonic_points(x: ArrayLike, y: ArrayLike) -> tuple[NDArray[np.float64], NDArray[np.float64]]:
    """The fitted map's points (x increasing, y non-decreasing in [0, 1]), unit weights."""
    xs = np.asarray(x, dtype=np.float64).ravel()
    ys = np.asarray(y, dtype=np.float64).ravel()
    if xs.shape != ys.shape or not xs.size:
        raise ValueError(f"isotonic fit: {xs.size} x and {ys.size} y values: pass one of each, at least one")
    if not (np.all(np.isfinite(xs)) and np.all(np.isfinite(ys))):
        raise ValueError("isotonic fit: x and y must be finite")
    order = np.lexsort((ys, xs))
    ux, uy, uw = _merge_ties(xs[order], ys[order])
    fitted = np.clip(_pool(uy, uw), 0.0, 1.0)
    keep = np.ones(fitted.size, dtype=bool)
    keep[1:-1] = (fitted[1:-1] != fitted[:-2]) | (fitted[1:-1] != fitted[2:])
    return np.asarray(ux, dtype=np.float64)[keep], fitted[keep]


def _merge_ties(x: NDArray[np.float64], y: NDArray[np.float64]) -> tuple[list[float], list[float], list[float]]:
    """Sorted points merged as scikit-learn's ``_make_unique``: each point's first x, the mean of
    its y, its row count as weight."""
    gaps = np.diff(x)
    tiny = (gaps > 0) & (gaps < RESOLUTION)
    if not tiny.any() and np.array_equal(y, np.round(y)) and float(np.abs(y).max()) * y.size < 2**53:
        # The common case, in numpy: no x within a resolution of another but equal (so a point ends
        # where x grows), and y whole numbers (right/wrong: 0 or 1), so any order of summing is exact.
        starts = np.concatenate([[0], np.flatnonzero(gaps >= RESOLUTION) + 1])
        weights = np.diff(np.append(starts, x.size)).astype(np.float64)
        sums = np.add.reduceat(y, starts)
        return x[starts].tolist(), (sums / weights).tolist(), weights.tolist()
    # Otherwise point by point, scikit-learn's loop: a point's first x anchors it (not the last
    # one merged), and y is summed in row order.
    xl, yl = x.tolist(), y.tolist()
    px, py, pw = [], [], []
    anchor, total, weight = xl[0], 0.0, 0.0
    for xi, yi in zip(xl, yl, strict=True):
        if xi - anchor >= RESOLUTION:
            px.append(anchor)
            py.append(total / weight)
            pw.append(weight)
            anchor, total, weight = xi, yi * 1.0, 1.0
        else:
            total += yi * 1.0
            weight += 1.0
    px.append(anchor)
    py.append(total / weight)
    pw.append(weight)
    return px, py, pw


def _pool(x: list[float], w: list[float]) -> NDArray[np.float64]:
    """Pool adjacent violators, increasing: scipy's ``pava`` (Busing 2022, Algorithm 1, with its
    ``>=`` on both repairs) line for line, so every block's mean is rounded as scipy rounds it.
    ``x`` and ``w`` are overwritten with the blocks' means and weights."""
    n = len(x)
    ends = [0] * (n + 1)  # block k is x[ends[k]:ends[k + 1]]
    ends[1] = 1
    b = 0
    xb_prev, wb_prev = x[0], w[0]
    i = 1
    while i < n:
        b += 1
        xb, wb = x[i], w[i]
        if xb_prev >= xb:
            b -= 1
            sb = wb_prev * xb_prev + wb * xb
            wb += wb_prev
            xb = sb / wb
            while i < n - 1 and xb >= x[i + 1]:
                i += 1
                sb += w[i] * x[i]
                wb += w[i]
                xb = sb / wb
            while b > 0 and x[b - 1] >= xb:
                b -= 1
                sb += w[b] * x[b]
                wb += w[b]
                xb = sb / wb
        x[b] = xb_prev = xb
        w[b] = wb_prev = wb
        ends[b + 1] = i + 1
        i += 1
    return np.repeat(np.asarray(x[:b + 1], dtype=np.float64), np.diff(ends[:b + 2]))
