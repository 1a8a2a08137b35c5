"""The one balancing solver: at what step time do the devices' shares add up to the global
batch (pure).

Each device computes, within a step time T, the most samples its curve allows
(`curve.within(T, top)`, at most its cap); the balanced step is the least T at which they
hold the global batch: no device waits for another, and no other split of the batch finishes
sooner. `bracket` finds it by bisection for any count of samples held that grows with T (the
planner's continuous split on lines, the re-balancer's integer shares on measured curves);
`balanced_time` asks it of curves, or, for a table of published times, of the times where a
share changes (`levels`). `fill` turns it into integer shares.

>>> from hetflow.perf.curve import Line, Table
>>> round(balanced_time([Line(0.01, 1e-3), Line(0.01, 2e-3)], 96), 6)  # 64 + 32 samples
0.074
>>> balanced_time([Line(0.0, 1e-3)] * 2, 96, caps=[16, 16])  # the caps cannot hold it
inf
>>> t = Table((0.1, 0.15, 0.2, 0.3))
>>> balanced_time([t], 6, counts=[2], levels=t.steps)  # 2 devices, 3 samples each
0.2
>>> fill([Line(0.01, 1e-3).time, Line(0.01, 2e-3).time], 96, [96, 96])
[64, 32]
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Callable, Sequence
from typing import Protocol

from hetflow.perf.curve import most_within


class StepCurve(Protocol):
    """What the solver asks of a device: its time at a batch, and the inverse."""

    def time(self, b: float) -> float: ...

    def within(self, t: float, top: float) -> float: ...


def bracket(
    held: Callable[[float], float], need: float, start: float, iterations: int = 100
) -> tuple[float, float]:
    """(lo, hi) with held(lo) < need <= held(hi), by bisection from [0, start] (start doubled
    until it holds `need`); `held` non-decreasing. With 60 iterations or more, hi is the least
    float at which `held` reaches `need`, whatever the start."""
    lo, hi = 0.0, start
    while held(hi) < need:
        hi *= 2
    for _ in range(iterations):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if held(mid) < need else (lo, mid)
    return lo, hi


def _tops(n: int, global_batch: int, caps: Sequence[int | None] | None) -> list[float]:
    """Each device's most samples: its cap, and never past the batch."""
    caps = list(caps) if caps is not None else [None] * n
    return [float(global_batch) if c is None else float(min(c, global_batch)) for c in caps]


def held(
    curves: Sequence[StepCurve],
    t: float,
    tops: Sequence[float],
    counts: Sequence[int] | None = None,
) -> float:
    """Samples the devices compute within `t`, each at most its top (`counts`: how many
    devices share each curve, 1 each by default)."""
    counts = counts if counts is not None else [1] * len(curves)
    return sum(n * c.within(t, top) for c, top, n in zip(curves, tops, counts, strict=True))


def balanced_time(
    curves: Sequence[StepCurve],
    global_batch: int,
    caps: Sequence[int | None] | None = None,
    counts: Sequence[int] | None = None,
    levels: Sequence[float] | None = None,
) -> float:
    """The least step time at which the devices (`counts` of each curve, 1 by default), each
    computing the most its curve allows under its cap, hold `global_batch`; inf where the caps
    cannot hold it. `levels`: the sorted times at which a share may change (a `Table`'s), the
    answer being one of them."""
    counts = list(counts) if counts is not None else [1] * len(curves)
    tops = _tops(len(curves), global_batch, caps)
    if sum(n * top for n, top in zip(counts, tops, strict=True)) < global_batch:
        return math.inf
    if levels is not None:
        lo, hi = 0, len(levels) - 1
        while lo < hi:
            mid = (lo + hi) // 2
            if held(curves, levels[mid], tops, counts) >= global_batch:
                hi = mid
            else:
                lo = mid + 1
        return levels[lo]
    start = max(max(c.time(1) for c in curves), 1e-9)
    return bracket(lambda t: held(curves, t, tops, counts), global_batch, start)[1]


def fill(
    costs: Sequence[Callable[[int], float]],
    global_batch: int,
    ceilings: Sequence[int],
    floors: Sequence[int] | None = None,
) -> list[int]:
    """Integer shares, each at least its floor (1 by default) and at most its ceiling, summing
    to `global_batch`, whose largest cost is least: the shares all ranks reach within the time
    `bracket` finds, then one sample at a time to the rank whose cost stays lowest (optimal for
    non-decreasing costs). A ValueError where the ceilings cannot hold the batch or the floors
    pass it."""
    n = len(costs)
    floors = list(floors) if floors is not None else [1] * n
    if sum(ceilings) < global_batch or sum(floors) > global_batch:
        raise ValueError(f"global_batch: {global_batch} does not fit the ranks' bounds")

    def within(t: float) -> int:
        return sum(most_within(c, t, h) for c, h in zip(costs, ceilings, strict=True))

    lo, _ = bracket(within, global_batch, max(cost(1) for cost in costs), iterations=60)
    b = [max(f, most_within(c, lo, h)) for c, h, f in zip(costs, ceilings, floors, strict=True)]
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
