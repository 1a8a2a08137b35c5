"""The re-balancer: re-plans local batches during a run from the step times the ranks
measure (pure; every rank holds one and feeds it the same figures)."""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from dataclasses import dataclass, field

from hetflow.training.plan.balance import balance_with_exclusion, micro_cost

# Steps in a row that a rank's time must lie beyond `Rebalancer.jump` to count as a sudden change;
# the re-plan after one is made from these steps alone.
SUDDEN_STEPS = 2
# Re-plans whose prediction error the re-balancer remembers (`Rebalancer.margin`).
ERRORS_KEPT = 3


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
    is fitted through them: the profile times batches from about a quarter of an equal share
    (8 to 64 for 128 samples on 4 workers: `launch.spec.default_profile_batches`), and a slow
    worker's time at batch 1 or 2 can lie far off that line (docs/measurements/host.md,
    gpu.md), which scaling alone cannot express. A rank
    whose time at a batch it ran before moves by more than a factor `jump` (1 + 3 x
    `threshold`, far beyond noise) has changed speed: its older points are dropped, and with
    them the model's recorded errors and rejected plans (they measured other speeds). Without a
    profiled c_i (`per_sample_s` None), the first window sets it.

    Every rank holds one and feeds it the same all-gathered figures (a window's means; after a
    `sudden_change`, the two steps that showed it), so every rank reaches the same plan with no
    extra collective. Hysteresis: a new plan is adopted only when it is
    predicted to shorten the step by more than `margin`: `threshold / 2`, or the model's own
    error on its last re-plans where that is larger, so that neither noise nor a model that
    does not hold at the batches it proposes makes the plan oscillate. Verification: a new
    plan whose first window is slower than the old plan's last
    (by more than `threshold / 2`) is reverted and not proposed again until the speeds change;
    what it measured stays in `points`, so the next proposal knows the model was wrong there.

    `micro` (`train.accumulate` 'auto'): a share may pass its rank's cap, run as micro-batches
    that each pay a_i (`balance.micro_cost`); a rank's time is then scaled from its profile's
    fit at that cost, and its line is re-fitted only through batches run as as many
    micro-batches (a line through points of different counts would fold their latencies into
    its slope).
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
    excluded: list[str] = field(default_factory=list)  # why the last proposal left ranks out
    errors: list[float] = field(default_factory=list)  # measured / predicted step - 1, per re-plan
    micro: bool = False  # shares past the caps, as micro-batches

    @property
    def margin(self) -> float:
        """The predicted gain (step before / step after - 1) a proposal must exceed: half the
        threshold, or the model's own demonstrated error where that is larger (the largest
        |measured / predicted - 1| of its last ERRORS_KEPT re-plans): a plan predicted 10%
        faster by a model that was 15% off last time is no evidence of a faster plan."""
        return max(self.threshold / 2, max((abs(e) for e in self.errors), default=0.0))

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
        for a0, c0, pts, b, cap in zip(
            self.latency_s, self.per_sample_s, self.points, self.latest, self.caps, strict=True
        ):
            if not pts or b not in pts:  # never measured with samples (left out): the profile's
                latency.append(a0)
                per_sample.append(c0)
                continue
            times = list(pts.values())
            if (
                len(pts) >= 2
                and max(times) > min(times) * self.jump
                and len({micro_cost(1, 0, x, cap, self.micro) for x in pts}) == 1
            ):
                c, a = statistics.linear_regression(list(pts), times)
                if c > 0 and a >= 0:
                    latency.append(a)
                    per_sample.append(c)
                    continue
            model = micro_cost(a0, c0, b, cap, self.micro)
            scale = pts[b] / model if model > 0 else 1.0
            latency.append(scale * a0)
            per_sample.append(scale * c0)
        return latency, per_sample

    def step_times(self, plan: Sequence[int]) -> list[float]:
        latency, per_sample = self.model()
        # a rank left out (batch 0) computes nothing and waits for no one
        return [
            micro_cost(a, c, b, cap, self.micro) if b else 0.0
            for a, c, b, cap in zip(latency, per_sample, plan, self.caps, strict=True)
        ]

    def observe(self, plan: Sequence[int], compute_s_per_step: Sequence[float]) -> None:
        """Feed each rank's mean compute time per step over a window in which it ran `plan`."""
        self.last_step_s = max(compute_s_per_step)
        failed = False
        if self.trial is not None and list(plan) != self.trial["plan"]:
            before, self.trial, after = self.trial, None, max(compute_s_per_step)
            if before.get("predicted_s"):  # how far the model was off, at the batches it chose
                self.errors = [
                    *self.errors[-(ERRORS_KEPT - 1) :],
                    after / before["predicted_s"] - 1,
                ]
            if after > before["step_s"] * (1 + self.threshold / 2):
                # The model promised a shorter step and the measurement says longer: it does not
                # hold at these batches (a device's step is not affine near batch 1, say). Go
                # back, and do not propose this plan again until the speeds change.
                self.rejected.append(list(plan))
                self.revert_to = before["plan"]
                failed = True
        if self.per_sample_s is None:
            self.per_sample_s = [
                max(t - a, 0.05 * t) / max(b, 1)
                for t, a, b in zip(compute_s_per_step, self.latency_s, plan, strict=True)
            ]
        if self.points is None:
            self.points = [{} for _ in plan]
        w = self.smoothing
        latest = list(self.latest) if self.latest is not None else list(plan)
        for i, (pts, b, t) in enumerate(zip(self.points, plan, compute_s_per_step, strict=True)):
            if b == 0:  # left out: its time says nothing of its speed; keep what was known
                continue
            latest[i] = b
            if (
                b in pts and not failed and not 1 / self.jump <= t / pts[b] <= self.jump
            ):  # speed changed
                pts.clear()
                self.rejected = []  # what failed before may work now
                self.errors = []  # and what the model got wrong before says nothing now
            pts[b] = w * t + (1 - w) * pts[b] if b in pts else t
        self.latest = latest

    def sudden_change(
        self,
        rows: Sequence[Sequence[float]],
        plan: Sequence[int] | None = None,
        recent: int = SUDDEN_STEPS,
        reference: int = 3,
    ) -> bool:
        """Whether a rank's speed has jumped: its compute time in each of the last `recent` rows
        lies more than `jump` times above, or each more than `jump` times below, its median over
        the `reference` or more rows before them.

        `rows[step][rank]`: compute time per step, every row under the same `plan`. Two steps in
        a row, not one: a single slow step is noise (a page fault, the host), and each
        further step a straggler runs on the old plan costs a step of its slow pace. A rank the
        plan leaves out (batch 0) is not looked at: its empty step's time is noise, not speed.
        """
        if len(rows) < recent + reference:
            return False
        jump = self.jump
        for rank in range(len(rows[0])):
            if plan is not None and plan[rank] == 0:
                continue
            median = statistics.median(row[rank] for row in rows[:-recent])
            last = [row[rank] for row in rows[-recent:]]
            if median > 0 and (min(last) > median * jump or max(last) * jump < median):
                return True
        return False

    def imbalance(self, plan: Sequence[int]) -> float:
        """How far the slowest rank's predicted step lies above the mean of the ranks that
        compute (a rank left out, batch 0, waits for no one and is not in the mean)."""
        times = [t for t, b in zip(self.step_times(plan), plan, strict=True) if b]
        mean = sum(times) / len(times) if times else 0.0
        return max(times) / mean - 1 if mean > 0 else 0.0

    def propose(self, plan: Sequence[int], step: int) -> list[int] | None:
        """A new plan, or None when the current one is good enough: its ranks balanced within
        `threshold` and none left out. A plan that leaves a rank out (batch 0) is looked at
        again every window, since the others slowing down can make that rank worth its fixed
        cost again (its own time is not measured while it is out: the model keeps its last)."""
        if self.revert_to is not None:
            back, self.revert_to = self.revert_to, None
            self.history.append({"step": step, "plan": back, "reverted": list(plan)})
            return back
        if self.points is None:
            return None
        current = self.imbalance(plan)
        if current <= self.threshold and 0 not in plan:
            return None
        latency, per_sample = self.model()
        new, self.excluded = balance_with_exclusion(
            per_sample, latency, self.global_batch, self.caps, micro=self.micro
        )
        before, after = max(self.step_times(plan)), max(self.step_times(new))
        gain = before / after - 1 if after > 0 else 0.0
        if new == list(plan) or new in self.rejected or gain <= self.margin:
            return None
        self.trial = {"plan": list(plan), "step_s": self.last_step_s, "predicted_s": after}
        self.history.append(
            {
                "step": step,
                "plan": new,
                "imbalance_before": round(current, 4),
                "predicted_speedup": round(before / after, 4),
                **({"excluded": self.excluded} if self.excluded else {}),
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
            "errors": self.errors,
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
        self.errors = list(state.get("errors", []))


def narrowed_state(state: dict, keep: list[int]) -> dict:
    """`Rebalancer.state()` of a run as it goes on with the ranks `keep` (old rank of each new
    one, in order) alone: each rank's measurements are its worker's; the log of re-plans and
    the model's errors stay; the plans of the old ranks (rejected, on trial, to revert to)
    mean nothing on the new ones and are dropped (pure)."""
    per_rank = ("per_sample_s", "points", "latest")
    picked = {k: None if state.get(k) is None else [state[k][i] for i in keep] for k in per_rank}
    return {**state, **picked, "rejected": [], "trial": None, "revert_to": None}
