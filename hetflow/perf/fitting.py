"""Line fits of measured times (pure: numpy, no torch, no I/O): the performance model fitted.

The probes time a step or a transfer at a few sizes and fit `t = a + b x size`; these are the
fits, kept apart so that they can be tested without a cluster.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np


def fit_affine(xs: Sequence[float], ts: Sequence[float]) -> tuple[float, float]:
    """(intercept, slope) of t = a + b x by least squares; needs two distinct x."""
    x = np.asarray(xs, dtype=float)
    t = np.asarray(ts, dtype=float)
    if len(set(x.tolist())) < 2:
        raise ValueError("fit_affine: need at least two distinct x values")
    (a, b), *_ = np.linalg.lstsq(np.stack([np.ones_like(x), x], axis=1), t, rcond=None)
    return float(a), float(b)


def fit_transfer(nbytes: Sequence[float], ts: Sequence[float]) -> tuple[float, float]:
    """(latency s, s per byte) of t = latency + bytes / bandwidth from one time per size.

    The slope is the least-squares fit (the largest messages weigh most, as they should for a
    bandwidth); the latency is what the smallest message took beyond its bytes, so that a
    sleep's wake-up jitter on a busy host shows as latency and does not bend the bandwidth.
    """
    _, slope = fit_affine(nbytes, ts)
    if slope <= 0:  # latency hides the bytes (loopback): report the bandwidth's lower bound,
        largest = max(range(len(nbytes)), key=lambda i: nbytes[i])  # all of it transfer
        slope = max(ts[largest], 1e-12) / max(nbytes[largest], 1)
    small = min(range(len(nbytes)), key=lambda i: nbytes[i])
    return max(ts[small] - slope * nbytes[small], 0.0), slope


def robust_affine(
    xs: Sequence[float], ts: Sequence[float], outlier: float = 0.3
) -> tuple[float, float, float | None]:
    """(a, b, dropped x) of t = a + b x; with 4+ points, one point may be left out.

    The candidate is the point without which the others lie best on a line; it is left out
    when it lies more than `outlier` (relative) off that line: a burst of load on the shared
    host that spoiled most samples of one batch size must not bend the fit.
    """
    a, b = fit_affine(xs, ts)
    if len(xs) < 4:
        return a, b, None
    best = None
    for i in range(len(xs)):
        rest = [j for j in range(len(xs)) if j != i]
        ai, bi = fit_affine([xs[j] for j in rest], [ts[j] for j in rest])
        spread = max(
            abs(ts[j] / (ai + bi * xs[j]) - 1) if ai + bi * xs[j] > 0 else math.inf for j in rest
        )
        if best is None or spread < best[0]:
            best = (spread, i, ai, bi)
    _, i, ai, bi = best
    predicted = ai + bi * xs[i]
    if predicted > 0 and abs(ts[i] / predicted - 1) > outlier:
        return ai, bi, xs[i]
    return a, b, None
