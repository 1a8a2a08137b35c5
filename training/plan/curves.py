"""Step-time curves learned from a run's own steps, and batches balanced on them (pure).

A worker's compute time per step as a function of its local batch: the means it measured at
the batches it ran, joined piecewise-linearly, so that a device whose time does not follow a
line (a GPU flat below its knee, a throughput bump at one batch) is planned from what it did
rather than from a line through it. Outside the batches it ran the curve extends the points
by a line: the line fitted through them where their times spread beyond noise, else its
prior (the profile history's fit, a preset's published ratio, or proportional where nothing
is known) scaled through the nearest point. Times never fall as the batch grows, and never
below proportional from the smallest point (a device does not run a sample faster than its
share of the smallest batch it ran).

`balance_on_curves` splits a global batch so that the slowest computing rank's step is
shortest (the greedy fill is optimal for non-decreasing costs), leaves out a rank whose least
share would lengthen the step by more than a margin, and bounds each share by a ceiling (a
memory cap, or a bounded move above the largest batch measured). Our own: torch and Ray have
no per-worker batch planner; AdaptDL's goodput model assumes a line.

>>> c = Curve(prior=(0.0, 1.0), points=((16, 0.080), (32, 0.090), (64, 0.170)))
>>> round(c.time(8), 4), round(c.time(24), 4), round(c.time(48), 4)
(0.0643, 0.085, 0.13)
>>> balance_on_curves([c, Curve(prior=(0.0, 0.002))], 96)[0]
[40, 56]
"""

from __future__ import annotations

import heapq
import itertools
import math
import statistics
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import cached_property

from hetflow.training.plan.balance import micro_split

# How far above the largest batch a rank has run a plan may move its share in one re-plan:
# a curve is trusted near what was measured, and a memory cap not yet known is approached in
# bounded steps (the run measures the batch before it goes further).
MOVE_FACTOR = 4


@dataclass(frozen=True)
class Curve:
    """One rank's compute time per step against its local batch (see the module's docstring).

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
            a, c = self.prior
            return a + c * b
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
    `cap` as micro-batches, `balance.micro_split`) the sum of its micro-batches' times."""
    if not micro or cap is None:
        return curve.time
    return lambda b: sum(curve.time(m) for m in micro_split(b, cap))


def _most_within(cost: Callable[[int], float], t: float, hi: int) -> int:
    """The largest share in [0, hi] whose cost is at most `t` (costs non-decreasing)."""
    lo, top = 0, hi
    while lo < top:
        mid = (lo + top + 1) // 2
        lo, top = (mid, top) if cost(mid) <= t else (lo, mid - 1)
    return lo


def fill(
    costs: Sequence[Callable[[int], float]],
    global_batch: int,
    ceilings: Sequence[int],
    floors: Sequence[int] | None = None,
) -> list[int]:
    """Integer shares, each at least its floor (1 by default) and at most its ceiling, summing
    to `global_batch`, whose largest cost is least: the shares all ranks reach within a time
    found by bisection, then one sample at a time to the rank whose cost stays lowest. A
    ValueError where the ceilings cannot hold the batch or the floors pass it."""
    n = len(costs)
    floors = list(floors) if floors is not None else [1] * n
    if sum(ceilings) < global_batch or sum(floors) > global_batch:
        raise ValueError(f"global_batch: {global_batch} does not fit the ranks' bounds")
    lo, hi = 0.0, max(cost(1) for cost in costs)
    while sum(_most_within(c, hi, h) for c, h in zip(costs, ceilings, strict=True)) < global_batch:
        hi *= 2
    for _ in range(60):
        mid = (lo + hi) / 2
        held = sum(_most_within(c, mid, h) for c, h in zip(costs, ceilings, strict=True))
        lo, hi = (mid, hi) if held < global_batch else (lo, mid)
    b = [max(f, _most_within(c, lo, h)) for c, h, f in zip(costs, ceilings, floors, strict=True)]
    heap = [(costs[i](b[i] + 1), i) for i in range(n) if b[i] < ceilings[i]]
    heapq.heapify(heap)
    while sum(b) < global_batch:
        _, i = heapq.heappop(heap)
        b[i] += 1
        if b[i] < ceilings[i]:
            heapq.heappush(heap, (costs[i](b[i] + 1), i))
    while sum(b) > global_batch:  # the floors passed the batch: take from the slowest
        i = max((j for j in range(n) if b[j] > floors[j]), key=lambda j: costs[j](b[j]))
        b[i] -= 1
    return b


def step_on(costs: Sequence[Callable[[int], float]], plan: Sequence[int]) -> float:
    """The slowest computing rank's predicted compute time under `plan`."""
    return max((cost(b) for cost, b in zip(costs, plan, strict=True) if b), default=0.0)


def balance_on_curves(
    curves: Sequence[Curve],
    global_batch: int,
    caps: Sequence[int | None] | None = None,
    names: Sequence[str] | None = None,
    micro: bool = False,
    leave_out_margin: float = 0.05,
    move: float = MOVE_FACTOR,
) -> tuple[list[int], list[str]]:
    """(local batches, why each rank at 0 is): `fill` over the ranks kept, 0 for the others.

    Each share moves at most a factor `move` past the batches its rank ran (`Curve.ceiling` of
    its cap, `Curve.floor`; with `micro` a share may pass the cap as micro-batches, the
    bounded move still holds); a rank whose cap is 0 holds no
    sample. Greedy: while leaving one more rank out shortens the predicted step by more than
    `leave_out_margin` of it, the rank whose leaving shortens it most goes; one rank stays, and
    no rank is left out where the others would pass their bounded moves to take its share.
    Where even the whole cluster's bounded moves cannot hold the batch, they give way to the
    caps."""
    n = len(curves)
    caps = list(caps) if caps is not None else [None] * n
    names = list(names) if names is not None else [f"rank {i}" for i in range(n)]
    costs = [cost_of(c, cap, micro) for c, cap in zip(curves, caps, strict=True)]
    tops = [c.ceiling(None if micro else cap, move) for c, cap in zip(curves, caps, strict=True)]
    ceilings = [global_batch if t is None else min(t, global_batch) for t in tops]
    floors = [c.floor(move) for c in curves]
    why = [
        f"{names[i]}: its device holds no sample (memory cap 0)" for i in range(n) if caps[i] == 0
    ]
    kept = [i for i in range(n) if caps[i] != 0]
    if not kept:
        raise ValueError("caps: every rank's memory cap is 0: no rank holds a sample")

    def plan_of(ranks: list[int], relax: bool = False) -> list[int] | None:
        return _fill_ranks(costs, ranks, (ceilings, floors), caps, global_batch, micro, relax)

    plan = plan_of(kept, relax=True)
    if plan is None:
        raise ValueError(f"caps: the ranks' caps cannot hold the global batch of {global_batch}")
    now = step_on(costs, plan)
    while len(kept) > 1:
        options = []
        for i in kept:
            other = plan_of([j for j in kept if j != i])
            if other is not None:
                options.append((step_on(costs, other), i, other))
        if not options:
            break
        after, worst, other = min(options)
        if not after < now * (1 - leave_out_margin):
            break
        why.append(
            f"{names[worst]}: the step is predicted {after:.3g} s without it against "
            f"{now:.3g} s with it (its share of {plan[worst]} samples: "
            f"{costs[worst](plan[worst]):.3g} s)"
        )
        kept = [j for j in kept if j != worst]
        plan, now = other, after
    return plan, why


def _fill_ranks(costs, ranks, bounds, caps, global_batch, micro, relax) -> list[int] | None:
    """`fill` over `ranks` alone (0 for the others) within their bounded moves (`bounds`:
    ceilings, floors); where those cannot hold the batch and `relax`, within their caps and
    from 1; else None."""
    ceilings, floors = bounds
    room, least = [ceilings[i] for i in ranks], [floors[i] for i in ranks]
    if (sum(room) < global_batch or sum(least) > global_batch) and relax:
        room = [global_batch if caps[i] is None or micro else caps[i] for i in ranks]
        least = [1] * len(ranks)
    if sum(room) < global_batch or sum(least) > global_batch:
        return None
    out = [0] * len(costs)
    part = fill([costs[i] for i in ranks], global_batch, room, least)
    for i, b in zip(ranks, part, strict=True):
        out[i] = b
    return out


def relative_spread(values: Sequence[float]) -> float:
    """The coefficient of variation of `values` (0 for fewer than two or a zero mean).

    >>> round(relative_spread([0.9, 1.1, 1.0, 1.0]), 3)
    0.082
    """
    if len(values) < 2:
        return 0.0
    mean = statistics.fmean(values)
    return statistics.stdev(values) / mean if mean > 0 and math.isfinite(mean) else 0.0
