"""Batches balanced on the step-time curves a run learned from its own steps (pure).

The curves are the performance model's (`hetflow.perf.curve.Curve`: the means a worker
measured at the batches it ran, joined piecewise-linearly, extended by a fitted line or its
prior: the profile history's fit, a preset's published ratio, or proportional where nothing
is known); the integer shares are its solver's (`hetflow.perf.balance.fill`). What this room
adds is the plan's decision: which ranks to leave out, and how far a share may move.

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

import math
import statistics
from collections.abc import Sequence

from hetflow.perf.balance import fill, step_on
from hetflow.perf.curve import MOVE_FACTOR, Curve, cost_of, micro_split


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


def per_pass(points: dict[int, float], cap: int | None) -> dict[int, float]:
    """A rank's points (batch -> step time) as one pass's where its batch runs as micro-batches
    of at most `cap` (`perf.curve.micro_split`): a share of k micro-batches is a pass of
    share / k samples taking 1 / k of its time; unchanged where there is no cap.

    >>> per_pass({4: 0.05, 16: 0.2}, 8)
    {4: 0.05, 8: 0.1}
    """
    if cap is None:
        return points
    out = {}
    for b, t in points.items():
        k = len(micro_split(b, cap))
        out[math.ceil(b / k)] = t / k
    return out
