"""The heterogeneity scheduler: local batch sizes in proportion to measured speed (pure).

    >>> plan_batches([1, 1, 2, 4], 128)
    [16, 16, 32, 64]
    >>> plan_batches([1, 1, 2, 4], 128, caps=[None, None, None, 40])
    [22, 22, 44, 40]
    >>> balance_batches([0.04, 0.04, 0.02, 0.01], [0.4, 0.4, 0.2, 0.1], 128)
    [11, 11, 32, 74]
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field


class PlanError(ValueError):
    """Inputs no plan can satisfy; the message names the field."""


def _check(speeds: Sequence[float], global_batch: int, caps: Sequence[int | None]) -> None:
    n = len(speeds)
    if n == 0:
        raise PlanError("speeds: at least one worker is needed")
    for i, s in enumerate(speeds):
        if not (isinstance(s, (int, float)) and math.isfinite(s) and s > 0):
            raise PlanError(f"speeds[{i}]: must be a finite number > 0 (got {s!r})")
    if global_batch < n:
        raise PlanError(f"global_batch: {global_batch} is smaller than the {n} workers")
    if len(caps) != n:
        raise PlanError(f"caps: {len(caps)} caps for {n} workers")
    for i, c in enumerate(caps):
        if c is not None and c < 1:
            raise PlanError(f"caps[{i}]: must be >= 1 (got {c})")
    if all(c is not None for c in caps) and sum(caps) < global_batch:
        raise PlanError(f"caps: they sum to {sum(caps)}, less than global_batch={global_batch}")


def plan_batches(
    speeds: Sequence[float], global_batch: int, caps: Sequence[int | None] | None = None
) -> list[int]:
    """Integer local batches b_i: sum b_i = global_batch, b_i ~ speed_i, 1 <= b_i <= cap_i.

    The continuous share is x_i = clip(lam * s_i, 1, cap_i) with lam chosen so that sum x_i =
    global_batch (water-filling); the integers are its floors plus the largest remainders.
    """
    caps = list(caps) if caps is not None else [None] * len(speeds)
    _check(speeds, global_batch, caps)
    return _apportion(lambda lam: [lam * s for s in speeds], speeds, global_batch, caps)


def balance_batches(
    per_sample_s: Sequence[float],
    latency_s: Sequence[float],
    global_batch: int,
    caps: Sequence[int | None] | None = None,
) -> list[int]:
    """Local batches that equalize predicted compute times a_i + c_i * b_i across ranks.

    With every latency a_i = 0 this is `plan_batches` with speeds 1 / c_i. A per-step fixed
    cost matters on slow devices, where it is paid at the device's pace: sizing by throughput
    at one batch size alone would starve them, step after step.
    """
    caps = list(caps) if caps is not None else [None] * len(per_sample_s)
    speeds = [1.0 / c if c > 0 else math.inf for c in per_sample_s]
    _check(speeds, global_batch, caps)
    lat = [max(0.0, a) for a in latency_s]
    return _apportion(
        lambda t: [(t - a) / c for a, c in zip(lat, per_sample_s, strict=True)],
        speeds, global_batch, caps,
        cost=lambda i, b: lat[i] + per_sample_s[i] * b,
    )


def _apportion(
    shares, speeds: Sequence[float], global_batch: int, caps: list[int | None], cost=None
) -> list[int]:
    """Integers from continuous shares(lam), monotone in lam: clip to [1, cap], sum to B.

    The rounding difference goes by largest remainder, or, given `cost(i, b)` (a rank's step
    time at batch b), one sample at a time to the rank whose step stays shortest, which keeps
    the slowest step minimal.
    """
    hi_caps = [float(c) if c is not None else math.inf for c in caps]

    def clipped(lam: float) -> list[float]:
        return [min(hc, max(1.0, v)) for v, hc in zip(shares(lam), hi_caps, strict=True)]

    lo, hi = 0.0, 1.0
    while sum(clipped(hi)) < global_batch:
        hi *= 2
    for _ in range(200):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if sum(clipped(mid)) < global_batch else (lo, mid)
    x = clipped(hi)
    b = [max(1, min(int(math.floor(v + 1e-9)), int(min(hc, global_batch)))) for v, hc in zip(x, hi_caps, strict=True)]
    if cost is not None:
        return _greedy_fill(b, global_batch, hi_caps, cost)
    # Hand out (or take back) the rounding difference by largest (smallest) remainder.
    order = sorted(range(len(b)), key=lambda i: (x[i] - b[i], speeds[i]), reverse=True)
    diff = global_batch - sum(b)
    while diff > 0:
        for i in order:
            if diff and b[i] < hi_caps[i]:
                b[i] += 1
                diff -= 1
    while diff < 0:
        for i in reversed(order):
            if diff and b[i] > 1:
                b[i] -= 1
                diff += 1
    return b


def _greedy_fill(b: list[int], global_batch: int, hi_caps: list[float], cost) -> list[int]:
    n = len(b)
    while sum(b) < global_batch:
        i = min((j for j in range(n) if b[j] < hi_caps[j]), key=lambda j: cost(j, b[j] + 1))
        b[i] += 1
    while sum(b) > global_batch:
        i = max((j for j in range(n) if b[j] > 1), key=lambda j: cost(j, b[j]))
        b[i] -= 1
    return b


def equal_batches(n: int, global_batch: int) -> list[int]:
    """The baseline split: as equal as integers allow."""
    return plan_batches([1.0] * n, global_batch)


@dataclass
class Rebalancer:
    """Re-plans from smoothed per-rank speed estimates when the imbalance passes a threshold.

    Each rank's compute time over a window is modelled as steps x (a_i + c_i x b_i): the
    per-step latency a_i comes from the profile, the per-sample time c_i is re-estimated from
    what the ranks report (an exponential moving average with weight `smoothing` on the newest
    window). Every rank holds one and feeds it the same all-gathered figures, so every rank
    reaches the same plan with no extra collective. Hysteresis: a new plan is adopted only when
    it is predicted to shorten the step by more than `threshold / 2`, so noise does not make
    the plan oscillate.
    """

    global_batch: int
    caps: list[int | None]
    latency_s: list[float]
    threshold: float = 0.10
    smoothing: float = 0.5
    per_sample_s: list[float] | None = None
    replans: int = 0
    history: list[dict] = field(default_factory=list)

    def step_times(self, plan: Sequence[int]) -> list[float]:
        assert self.per_sample_s is not None
        return [a + c * b for a, c, b in zip(self.latency_s, self.per_sample_s, plan, strict=True)]

    def observe(self, plan: Sequence[int], compute_s_per_step: Sequence[float]) -> None:
        """Feed each rank's mean compute time per step over a window in which it ran `plan`."""
        now = [max(t - a, 0.05 * t) / b for t, a, b in zip(compute_s_per_step, self.latency_s, plan, strict=True)]
        if self.per_sample_s is None:
            self.per_sample_s = now
        else:
            w = self.smoothing
            self.per_sample_s = [w * n + (1 - w) * o for n, o in zip(now, self.per_sample_s, strict=True)]

    def imbalance(self, plan: Sequence[int]) -> float:
        times = self.step_times(plan)
        mean = sum(times) / len(times)
        return max(times) / mean - 1 if mean > 0 else 0.0

    def propose(self, plan: Sequence[int], step: int) -> list[int] | None:
        """A new plan, or None when the current one is good enough."""
        if self.per_sample_s is None:
            return None
        current = self.imbalance(plan)
        if current <= self.threshold:
            return None
        new = balance_batches(self.per_sample_s, self.latency_s, self.global_batch, self.caps)
        before, after = max(self.step_times(plan)), max(self.step_times(new))
        if new == list(plan) or after > before * (1 - self.threshold / 2):
            return None
        self.replans += 1
        self.history.append(
            {"step": step, "plan": new, "imbalance_before": round(current, 4),
             "predicted_speedup": round(before / after, 4)}
        )
        return new
