"""The heterogeneity scheduler: local batch sizes in proportion to measured speed (pure).

    >>> plan_batches([1, 1, 2, 4], 128)
    [16, 16, 32, 64]
    >>> plan_batches([1, 1, 2, 4], 128, caps=[None, None, None, 40])
    [22, 22, 44, 40]
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
    hi_caps = [float(c) if c is not None else math.inf for c in caps]

    def total(lam: float) -> float:
        return sum(min(hc, max(1.0, lam * s)) for s, hc in zip(speeds, hi_caps, strict=True))

    lo, hi = 0.0, global_batch / min(speeds) + 1.0
    for _ in range(200):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if total(mid) < global_batch else (lo, mid)
    x = [min(hc, max(1.0, hi * s)) for s, hc in zip(speeds, hi_caps, strict=True)]
    b = [max(1, min(int(math.floor(v + 1e-9)), int(min(hc, global_batch)))) for v, hc in zip(x, hi_caps, strict=True)]
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


def equal_batches(n: int, global_batch: int) -> list[int]:
    """The baseline split: as equal as integers allow."""
    return plan_batches([1.0] * n, global_batch)


def step_time(plan: Sequence[int], per_sample_s: Sequence[float]) -> float:
    """Predicted synchronous step time: the slowest rank's compute."""
    return max(b * t for b, t in zip(plan, per_sample_s, strict=True))


def imbalance(plan: Sequence[int], per_sample_s: Sequence[float]) -> float:
    """max / mean of the ranks' compute times, minus 1 (0 = perfectly balanced)."""
    times = [b * t for b, t in zip(plan, per_sample_s, strict=True)]
    mean = sum(times) / len(times)
    return max(times) / mean - 1 if mean > 0 else 0.0


@dataclass
class Rebalancer:
    """Re-plans from a smoothed per-sample time when the imbalance passes a threshold.

    Every rank holds one and feeds it the same all-gathered figures, so every rank reaches the
    same plan with no extra collective. Hysteresis: a new plan is adopted only when it is
    predicted to shorten the step by more than `threshold / 2`, so noise does not make the plan
    oscillate; `smoothing` is the weight of the newest observation in the moving average.
    """

    global_batch: int
    caps: list[int | None]
    threshold: float = 0.10
    smoothing: float = 0.5
    per_sample_s: list[float] | None = None
    replans: int = 0
    history: list[dict] = field(default_factory=list)

    def observe(self, plan: Sequence[int], compute_s: Sequence[float]) -> None:
        """Feed the compute time of each rank over a window in which it ran `plan`."""
        now = [c / b for c, b in zip(compute_s, plan, strict=True)]
        if self.per_sample_s is None:
            self.per_sample_s = now
        else:
            a = self.smoothing
            self.per_sample_s = [a * n + (1 - a) * o for n, o in zip(now, self.per_sample_s, strict=True)]

    def propose(self, plan: Sequence[int], step: int) -> list[int] | None:
        """A new plan, or None when the current one is good enough."""
        if self.per_sample_s is None:
            return None
        current = imbalance(plan, self.per_sample_s)
        if current <= self.threshold:
            return None
        speeds = [1.0 / t for t in self.per_sample_s]
        new = plan_batches(speeds, self.global_batch, self.caps)
        before, after = step_time(plan, self.per_sample_s), step_time(new, self.per_sample_s)
        if new == list(plan) or after > before * (1 - self.threshold / 2):
            return None
        self.replans += 1
        self.history.append(
            {"step": step, "plan": new, "imbalance_before": round(current, 4),
             "predicted_speedup": round(before / after, 4)}
        )
        return new
