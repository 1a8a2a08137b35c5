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
import statistics
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
        speeds,
        global_batch,
        caps,
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
    b = [
        max(1, min(math.floor(v + 1e-9), int(min(hc, global_batch))))
        for v, hc in zip(x, hi_caps, strict=True)
    ]
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


# Steps in a row that a rank's time must lie beyond `Rebalancer.jump` to count as a sudden change;
# the re-plan after one is made from these steps alone.
SUDDEN_STEPS = 2


@dataclass
class Rebalancer:
    """Re-plans from smoothed per-rank speed estimates when the imbalance passes a threshold.

    Each rank's compute time per step is modelled as affine in its batch, `a_i + c_i x b_i`,
    learned from what the ranks report: per rank, the compute time measured at each batch it
    has run since its speed last changed (`points`; an exponential moving average with weight
    `smoothing` on the newest window). From one batch, or from batches whose times lie within
    noise of each other, the model is the profile's fit scaled to the newest measurement: a
    device that slows down (thermal throttling, a noisy neighbour, a straggler) is slower at
    every batch size, latency included, and a slope re-fitted from nearby batches would be mostly
    noise. Once a rank has run batches whose times differ by more than a factor `jump`, its line
    is fitted through them: the profile times batches 8 to 64, and a slow worker's time at batch
    1 or 2 can lie 30% off that line, which scaling alone cannot express. A rank whose time at a
    batch it ran before moves by more than a factor `jump` (1 + 3 x `threshold`, far beyond
    noise) has changed speed: its older points are dropped. Without a profiled c_i
    (`per_sample_s` None), the first window sets it.

    Every rank holds one and feeds it the same all-gathered figures (a window's means; after a
    `sudden_change`, the two steps that showed it), so every rank reaches the same plan with no
    extra collective. Hysteresis: a new plan is adopted only when it is
    predicted to shorten the step by more than `threshold / 2`, so noise does not make the plan
    oscillate. Verification: a new plan whose first window is slower than the old plan's last
    (by more than `threshold / 2`) is reverted and not proposed again until the speeds change;
    what it measured stays in `points`, so the next proposal knows the model was wrong there.
    """

    global_batch: int
    caps: list[int | None]
    latency_s: list[float]
    per_sample_s: list[float] | None = None
    threshold: float = 0.10
    smoothing: float = 0.5
    points: list[dict[int, float]] | None = None  # per rank: batch -> compute time measured
    latest: list[int] | None = None  # per rank: the batch of its newest measurement
    history: list[dict] = field(default_factory=list)
    rejected: list[list[int]] = field(default_factory=list)
    trial: dict | None = None  # the plan before the last re-plan, and its measured step
    revert_to: list[int] | None = None
    last_step_s: float = 0.0

    @property
    def jump(self) -> float:
        """A change of a rank's step time beyond this ratio is a change of speed, not noise."""
        return 1 + 3 * self.threshold

    @property
    def replans(self) -> int:
        """Plans adopted from the model (reverts of a failed one not counted)."""
        return sum("reverted" not in h for h in self.history)

    def model(self) -> tuple[list[float], list[float]]:
        """(a_i, c_i) per rank: each rank's compute time per step is a_i + c_i x batch."""
        assert self.per_sample_s is not None and self.points is not None and self.latest is not None
        latency, per_sample = [], []
        for a0, c0, pts, b in zip(
            self.latency_s, self.per_sample_s, self.points, self.latest, strict=True
        ):
            times = list(pts.values())
            if len(pts) >= 2 and max(times) > min(times) * self.jump:
                c, a = statistics.linear_regression(list(pts), times)
                if c > 0 and a >= 0:
                    latency.append(a)
                    per_sample.append(c)
                    continue
            scale = pts[b] / (a0 + c0 * b) if a0 + c0 * b > 0 else 1.0
            latency.append(scale * a0)
            per_sample.append(scale * c0)
        return latency, per_sample

    def step_times(self, plan: Sequence[int]) -> list[float]:
        latency, per_sample = self.model()
        return [a + c * b for a, c, b in zip(latency, per_sample, plan, strict=True)]

    def observe(self, plan: Sequence[int], compute_s_per_step: Sequence[float]) -> None:
        """Feed each rank's mean compute time per step over a window in which it ran `plan`."""
        self.last_step_s = max(compute_s_per_step)
        failed = False
        if self.trial is not None and list(plan) != self.trial["plan"]:
            before, self.trial, after = self.trial, None, max(compute_s_per_step)
            if after > before["step_s"] * (1 + self.threshold / 2):
                # The model promised a shorter step and the measurement says longer: it does not
                # hold at these batches (a device's step is not affine near batch 1, say). Go
                # back, and do not propose this plan again until the speeds change.
                self.rejected.append(list(plan))
                self.revert_to = before["plan"]
                failed = True
        if self.per_sample_s is None:
            self.per_sample_s = [
                max(t - a, 0.05 * t) / b
                for t, a, b in zip(compute_s_per_step, self.latency_s, plan, strict=True)
            ]
        if self.points is None:
            self.points = [{} for _ in plan]
        w = self.smoothing
        for pts, b, t in zip(self.points, plan, compute_s_per_step, strict=True):
            if (
                b in pts and not failed and not 1 / self.jump <= t / pts[b] <= self.jump
            ):  # speed changed
                pts.clear()
                self.rejected = []  # what failed before may work now
            pts[b] = w * t + (1 - w) * pts[b] if b in pts else t
        self.latest = list(plan)

    def sudden_change(
        self, rows: Sequence[Sequence[float]], recent: int = SUDDEN_STEPS, reference: int = 3
    ) -> bool:
        """Whether a rank's speed has jumped: its compute time in each of the last `recent` rows
        lies more than `jump` times above, or each more than `jump` times below, its median over
        the `reference` or more rows before them.

        `rows[step][rank]`: compute time per step, every row under the same plan. Two steps in a
        row, not one: a single slow step is noise (a page fault, the host), and each
        further step a straggler runs on the old plan costs a step of its slow pace.
        """
        if len(rows) < recent + reference:
            return False
        jump = self.jump
        for rank in range(len(rows[0])):
            median = statistics.median(row[rank] for row in rows[:-recent])
            last = [row[rank] for row in rows[-recent:]]
            if median > 0 and (min(last) > median * jump or max(last) * jump < median):
                return True
        return False

    def imbalance(self, plan: Sequence[int]) -> float:
        times = self.step_times(plan)
        mean = sum(times) / len(times)
        return max(times) / mean - 1 if mean > 0 else 0.0

    def propose(self, plan: Sequence[int], step: int) -> list[int] | None:
        """A new plan, or None when the current one is good enough."""
        if self.revert_to is not None:
            back, self.revert_to = self.revert_to, None
            self.history.append({"step": step, "plan": back, "reverted": list(plan)})
            return back
        if self.points is None:
            return None
        current = self.imbalance(plan)
        if current <= self.threshold:
            return None
        latency, per_sample = self.model()
        new = balance_batches(per_sample, latency, self.global_batch, self.caps)
        before, after = max(self.step_times(plan)), max(self.step_times(new))
        if new == list(plan) or new in self.rejected or after > before * (1 - self.threshold / 2):
            return None
        self.trial = {"plan": list(plan), "step_s": self.last_step_s}
        self.history.append(
            {
                "step": step,
                "plan": new,
                "imbalance_before": round(current, 4),
                "predicted_speedup": round(before / after, 4),
            }
        )
        return new

    def state(self) -> dict:
        """What a checkpoint keeps so that a resumed run re-plans as the lost one would have."""
        return {
            "per_sample_s": self.per_sample_s,
            "replans": self.history,
            "points": None if self.points is None else [sorted(p.items()) for p in self.points],
            "latest": self.latest,
            "rejected": self.rejected,
            "trial": self.trial,
            "revert_to": self.revert_to,
        }

    def restore(self, state: dict) -> None:
        self.per_sample_s, self.latest = state["per_sample_s"], state.get("latest")
        points = state.get("points")
        self.points = (
            None
            if points is None or self.latest is None
            else [{int(b): float(t) for b, t in p} for p in points]
        )
        self.history, self.rejected = state["replans"], state["rejected"]
        self.trial, self.revert_to = state["trial"], state["revert_to"]
