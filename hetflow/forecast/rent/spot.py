"""Spot instances in `hetflow recommend`: a mix's expected time and cost with each
type's interruption rate and the restart cost hetflow measures (pure, no I/O).

A mix of n_i spot instances of type i, each interrupted r_i times per instance-hour (the spot
table, `hetflow.infra.spot`), is interrupted lam = sum n_i r_i times an hour while it is rented:
while it trains, restarts and redoes steps alike (a replaced instance is a spot instance too).
Each interruption costs

    R = restart_s + (checkpoint_every / 2) x step_s      seconds

the group's restart, and half a checkpoint interval of steps redone on average (a node lost
without notice resumes from the last checkpoint). A run of T0 hours without interruptions then
takes T = T0 + lam x T x R, that is, in closed form,

    T = T0 / (1 - lam x R)      with  N = lam x T  interruptions expected,

finite while lam x R < 1; past it a mix is expected never to finish and is not priced. Its
cost is every instance's spot price, On-Demand x (1 - savings), times T (billing runs through
the restarts). T and the cost are expectations: `deadline_risk` gives the chance that the
interruptions of one run push it past a deadline.

The defaults: `SPOT_RESTART_S` is the mean of the group restarts `benchmarks/restart.py`
measures (a SIGKILL of one of 4 emulated workers under torchrun, to the first step after the
group's restart from its checkpoint; its runs and the command: docs/measurements/faults.md,
"A lost worker's restart"), the mean because T is an expectation; the checkpoint interval is
`TrainConfig.checkpoint_every`'s default. Neither counts the minutes a replacement instance
takes to boot and join: add them with `--restart-s`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

MARKETS = ("on-demand", "spot")
SPOT_RESTART_S = 16.0  # seconds: the mean of benchmarks/restart.py's restarts (module docstring)


@dataclass(frozen=True)
class Restart:
    """What one interruption costs: the group's restart and the steps redone since the last
    checkpoint (half the interval on average)."""

    restart_s: float = SPOT_RESTART_S
    checkpoint_every: int = 25  # TrainConfig.checkpoint_every's default

    def lost_s(self, step_s: float, steps: int) -> float:
        """Seconds one interruption costs a run of `steps` steps of `step_s` seconds."""
        return self.restart_s + min(self.checkpoint_every, steps) / 2 * step_s


def expected_hours(bare_h: float, per_hour: float, lost_s: float) -> float | None:
    """T = T0 / (1 - lam R): the expected hours of a run of `bare_h` hours uninterrupted,
    interrupted `per_hour` times an hour, each interruption costing `lost_s` seconds; None where
    lam R >= 1 (expected never to finish).

    >>> expected_hours(2.0, 0.0, 60.0), expected_hours(2.0, 6.0, 300.0)  # 1 - 6 x 300/3600
    (2.0, 4.0)
    >>> expected_hours(2.0, 12.0, 300.0) is None
    True
    """
    load = per_hour * lost_s / 3600
    return None if load >= 1 else bare_h / (1 - load)


def deadline_risk(
    bare_h: float, per_hour: float, lost_s: float, deadline_h: float
) -> tuple[int, float]:
    """(k, P): k interruptions push a run past `deadline_h`, and P is the chance of k or more,
    the interruptions a Poisson count of mean `per_hour` x `deadline_h` (k = 0: it misses it
    uninterrupted, P = 1).

    >>> k, p = deadline_risk(1.0, 0.5, 1800, 2.0)  # 2 interruptions of half an hour: 2 h
    >>> k, round(p, 4)  # mean 1: P(N >= 3)
    (3, 0.0803)
    """
    if bare_h > deadline_h:
        return 0, 1.0
    k = math.floor((deadline_h - bare_h) * 3600 / lost_s) + 1 if lost_s > 0 else 0
    if k <= 0:
        return 0, 1.0
    mean = per_hour * deadline_h
    below = sum(math.exp(-mean) * mean**i / math.factorial(i) for i in range(min(k, 170)))
    return k, max(0.0, 1.0 - below)


DEFAULT_RESTART = Restart()
