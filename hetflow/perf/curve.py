"""A device's compute time per step against its local batch (pure).

Every curve answers two questions: `time(b)`, the seconds of compute at batch b, and
`within(t, top)`, the most samples (at most `top`) it computes within t seconds; the
balancing solver (`perf.balance`) needs no more. A line is one curve (`Line`, a + c x b, whose
inverse is continuous); a table of published times by batch (`Table`), measured points
joined piecewise-linearly (`Curve`) and a share run as micro-batches under a memory cap
(`Micro`) are the others.

>>> line = Line(0.01, 1e-3)
>>> line.time(40), line.within(0.05, 100)
(0.05, 40.0)
>>> c = Curve(prior=(0.0, 1.0), points=((16, 0.080), (32, 0.090), (64, 0.170)))
>>> round(c.time(8), 4), round(c.time(24), 4), round(c.time(48), 4), c.within(0.09, 96)
(0.0643, 0.085, 0.13, 32)
>>> micro_split(15, 4), micro_split(8, 4), micro_split(3, None), micro_split(0, 4)
([4, 4, 4, 3], [4, 4], [3], [])
"""

from __future__ import annotations

import bisect
import itertools
import math
import statistics
from collections.abc import Callable
from dataclasses import dataclass
from functools import cached_property

# How far above the largest batch a rank has run a plan may move its share in one re-plan:
# a curve is trusted near what was measured, and a memory cap not yet known is approached in
# bounded steps (the run measures the batch before it goes further).
MOVE_FACTOR = 4


def micro_split(share: int, cap: int | None) -> list[int]:
    """The micro-batches a rank runs its `share` of the step as under its memory cap `cap`
    (accumulating their gradients): ceil(share / cap) of them, as equal as integers allow, so
    each is at most `cap`; the share in one pass where `cap` is None or holds it; none for 0."""
    if share <= 0:
        return []
    count = 1 if cap is None or cap >= share else math.ceil(share / cap)
    size, extra = divmod(share, count)
    return [size + 1] * extra + [size] * (count - extra)


def micro_cost(a: float, c: float, b: float, cap: int | None, micro: bool = False) -> float:
    """A rank's compute time for `b` samples: a + c x b in one pass; with micro-batches
    (`micro`), each of the ceil(b / cap) micro-batches pays the fixed cost `a` once.

    >>> micro_cost(0.1, 0.01, 10, 4, micro=True), micro_cost(0.1, 0.01, 10, 4)
    (0.4, 0.2)
    """
    count = math.ceil(b / cap) if micro and cap is not None and b > cap else 1
    return a * count + c * b


def micro_share(t: float, a: float, c: float, cap: int | None) -> float:
    """The most samples (continuous) a rank computes within `t` seconds when it runs them as
    micro-batches of at most `cap` (the inverse of `micro_cost` with `micro`): with k of them,
    b <= k x cap and k x a + c x b <= t; the k-th can begin once k x a + c x (k - 1) x cap < t.

    >>> round(micro_share(0.4, 0.1, 0.01, 4), 6), micro_share(0.45, 0.1, 0.01, 4)
    (10.0, 12)
    """
    if c <= 0:
        return math.inf
    if cap is None or t <= a:
        return (t - a) / c
    k = max(1, math.ceil((t + c * cap) / (a + c * cap)) - 1)
    return min(k * cap, (t - k * a) / c)


def most_within(cost: Callable[[int], float], t: float, hi: int) -> int:
    """The largest share in [0, hi] whose cost is at most `t` (costs non-decreasing)."""
    lo, top = 0, int(hi)
    while lo < top:
        mid = (lo + top + 1) // 2
        lo, top = (mid, top) if cost(mid) <= t else (lo, mid - 1)
    return lo


@dataclass(frozen=True)
class Line:
    """a + c x b seconds: a fixed cost per step (`a`) and a cost per sample (`c`)."""

    a: float
    c: float

    def time(self, b: float) -> float:
        return self.a + self.c * b

    def within(self, t: float, top: float = math.inf) -> float:
        """The samples (continuous) computed within `t`, in [0, top]."""
        if self.c <= 0:
            return top if t >= self.a else 0.0
        return min(top, max(0.0, (t - self.a) / self.c))


@dataclass(frozen=True)
class Micro:
    """`curve` with a share past `cap` run as micro-batches (`micro_split`), each its own
    pass: the share's time is the sum of theirs. On a line each pass pays the fixed cost."""

    curve: Line | Curve | Table
    cap: int | None

    def time(self, b: float) -> float:
        if isinstance(self.curve, Line):
            return micro_cost(self.curve.a, self.curve.c, b, self.cap, True)
        return sum(self.curve.time(m) for m in micro_split(int(b), self.cap))

    def within(self, t: float, top: float = math.inf) -> float:
        if isinstance(self.curve, Line):
            return min(top, max(0.0, micro_share(t, self.curve.a, self.curve.c, self.cap)))
        return most_within(self.time, t, top)


@dataclass(frozen=True)
class Table:
    """Seconds at batch 1, 2, ..., len(steps) (non-decreasing); no batch past the last."""

    steps: tuple[float, ...]

    def time(self, b: float) -> float:
        return self.steps[math.ceil(b) - 1] if b > 0 else 0.0

    def within(self, t: float, top: float = math.inf) -> int:
        return min(int(min(top, len(self.steps))), bisect.bisect_right(self.steps, t))


@dataclass(frozen=True)
class Curve:
    """One device's compute time per step, learned from the batches it ran: the means measured
    at them, joined piecewise-linearly, so that a device whose time does not follow a line (a
    GPU flat below its knee) is planned from what it did. Outside the batches it ran the curve
    extends the points by a line: the line fitted through them where their times spread beyond
    noise, else its prior scaled through the nearest point. Times never fall as the batch
    grows, and never below proportional from the smallest point.

    `prior`: (a, c) of a + c x b, the shape assumed where nothing was measured; `points`:
    (batch, mean seconds) measured, any order; `spread`: the ratio of the points' times beyond
    which a slope fitted through them is more than noise."""

    prior: tuple[float, float]
    points: tuple[tuple[int, float], ...] = ()
    spread: float = 1.3

    @cached_property  # `time` is called thousands of times a plan (`fill`)
    def _sorted(self) -> list[tuple[int, float]]:
        """The points by batch, each time raised to the largest at a smaller batch."""
        out: list[tuple[int, float]] = []
        for b, t in sorted(self.points):
            out.append((b, max(t, out[-1][1]) if out else t))
        return out

    @cached_property
    def _line(self) -> tuple[float, float] | None:
        """(a, c) fitted through the points where their times spread beyond noise and the fit
        is a line of positive slope; else None."""
        pts = self._sorted
        times = [t for _, t in pts]
        if len(pts) < 2 or max(times) <= min(times) * self.spread:
            return None
        c, a = statistics.linear_regression([b for b, _ in pts], times)
        return (a, c) if c > 0 else None

    def _prior_through(self, b0: int, t0: float, b: float) -> float:
        a, c = self.prior
        at = a + c * b0
        return t0 * (a + c * b) / at if at > 0 else t0 * b / b0

    def time(self, b: float) -> float:
        """Seconds of compute at batch `b` (0 for no samples)."""
        if b <= 0:
            return 0.0
        pts = self._sorted
        if not pts:
            return Line(*self.prior).time(b)
        (lo, t_lo), (hi, t_hi) = pts[0], pts[-1]
        if lo <= b <= hi:
            for (b0, t0), (b1, t1) in itertools.pairwise(pts):
                if b0 <= b <= b1:
                    return t0 + (t1 - t0) * (b - b0) / (b1 - b0) if b1 > b0 else t1
            return t_lo
        line = self._line
        if b < lo:
            t = t_lo + line[1] * (b - lo) if line else self._prior_through(lo, t_lo, b)
            return min(max(t, t_lo * b / lo), t_lo)
        t = t_hi + line[1] * (b - hi) if line else self._prior_through(hi, t_hi, b)
        return max(t, t_hi)

    def within(self, t: float, top: float) -> int:
        """The most whole samples, at most `top`, computed within `t`."""
        return most_within(self.time, t, top)

    def ceiling(self, cap: int | None, move: float = MOVE_FACTOR) -> int | None:
        """The largest share a re-plan may give: `cap`, and at most `move` times the largest
        batch measured (None: unbounded)."""
        bound = int(move * max(b for b, _ in self.points)) if self.points else None
        if cap is None:
            return bound
        return cap if bound is None else min(cap, bound)

    def floor(self, move: float = MOVE_FACTOR) -> int:
        """The least share a re-plan may give while the rank computes: the smallest batch
        measured over `move` (1 where nothing was measured). Leaving the rank out is apart."""
        return max(1, int(min(b for b, _ in self.points) / move)) if self.points else 1


def cost_of(curve: Curve, cap: int | None = None, micro: bool = False) -> Callable[[int], float]:
    """A rank's compute time for a share: one pass on `curve`, or with `micro` (shares past
    `cap` as micro-batches, `micro_split`) the sum of its micro-batches' times."""
    if not micro or cap is None:
        return curve.time
    return Micro(curve, cap).time
