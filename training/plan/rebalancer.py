"""The re-balancer: re-plans local batches during a run from the step times the ranks
measure (pure; every rank holds one and feeds it the same figures)."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field

from hetflow.perf.curve import MOVE_FACTOR, Curve, cost_of
from hetflow.training.plan.curves import balance_on_curves, per_pass
from hetflow.training.plan.measured import (
    entry_of,
    gain_bar,
    judge,
    record,
    return_to,
    start_trial,
    window_se,
)
from hetflow.training.plan.rebalancer_state import restore_from, state_of
from hetflow.training.plan.speed_change import host_noise, jump_of, jumps, scaled

# Steps in a row that a rank's time must lie beyond `Rebalancer.jump` to count as a sudden change;
# the re-plan after one is made from these steps alone.
SUDDEN_STEPS = 3
# Re-plans whose prediction error the re-balancer remembers (`Rebalancer.margin`).
ERRORS_KEPT = 3
# The first windows are short: after the first, each rank's curve is one point scaled through
# its prior, and the re-plan it gives is worth most; later windows hold `rebalance_every` steps.
LEARNING_WINDOWS = 3
LEARNING_ROWS = 4
# The least `Rebalancer.move` a run of reverts narrows the bounded moves to.
LEAST_MOVE = 1.25
# A re-plan whose predicted gain is below this many times its bar is adopted only when the
# window before proposed no share moving the other way: that twice in a row is seldom noise.
CLEAR_GAIN = 2.0
# A curve's point is the mean of its batch's rows since the rank's speed last changed, the
# newest this many: a window of a slow stretch moves it by its share of them, not by half.
MEMORY_ROWS = 40


@dataclass
class Rebalancer:
    """Re-plans from step-time curves learned from the run's own steps, when a re-plan's
    predicted gain beats the noise the run measured.

    Each rank's compute time per step is a curve in its batch (`curves.Curve`): the means it
    measured at the batches it ran since its speed last changed (`points`; the mean of the
    newest MEMORY_ROWS rows at each batch, `counts`), joined piecewise-linearly, and
    outside them a line through them where their times spread beyond `jump`, else the prior
    (`latency_s`, `per_sample_s`: the profile's fit, the history's, a preset's published ratio,
    or proportional where nothing is known) scaled through the nearest point. A device that
    slows down (throttling, a noisy neighbour, a straggler) is slower at every batch, and a
    device flat below its knee is planned from its flat points, which no line through them
    follows. A rank whose time at a batch it ran before moves by more than a factor `jump`
    (1 + 3 x `threshold`, or 4 standard deviations of the noise measured, far beyond it) has
    changed speed: a straggler is slower at every batch alike, so its other points are scaled
    by that factor (and weigh one window until measured again), and the model's recorded
    errors, the plans measured and those rejected are dropped (they measured other speeds).
    Without a prior c_i (`per_sample_s` None), the first window sets it.

    Every rank holds one and feeds it the same all-gathered figures (a window's means and the
    spread of its steps; after a `sudden_change`, the two steps that showed it), so every rank
    reaches the same plan with no extra collective.

    Deciding (`propose`): the plan balanced on the curves (`curves.balance_on_curves`, each
    share within a bounded move of what its rank ran) is adopted only when its predicted gain
    beats `margin`: twice the noise of a difference of two window means (the window's step
    spread, measured), the model's own error on its last re-plans, and a floor (`threshold / 2`),
    whichever is largest; plus the switch's cost spread over the steps left. Bringing back a
    rank the plan left out needs twice that (hysteresis: it pays the replica's copy and its
    hops of every all-reduce). A gain under `CLEAR_GAIN` times its bar is adopted only when the
    window before proposed no share moving the other way (decisions on windows, not on
    one), or a rank's speed jumped since (`sudden_change`: three steps in a row confirmed it).
    Verification on measured windows, not on the model (`observe`): a new plan is on
    trial, and no other is proposed, until its windows show its step shorter than the plan's
    before it beyond their noise (kept), or not (given up: the run goes back to the best plan
    it measured since the speeds last changed, so it never stays below the plan it started
    from, prior or equal split, nor below any plan it ran; a rank brought back is such a
    trial too). A plan given up is not proposed again until the speeds change; what it
    measured stays in `points`, so the next proposal knows the model was wrong there, and the
    shares' bounded move (`move`, a trust region: MOVE_FACTOR past the batches a rank ran)
    halves, down to LEAST_MOVE; a plan that holds doubles it back.

    `micro` (`train.accumulate` 'auto'): a share may pass its rank's cap, run as micro-batches;
    a point measured at a share of k micro-batches is one pass of share / k samples taking 1 / k
    of its time.
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
    noise: float = 0.0  # the newest window's step spread (coefficient of variation)
    rows: int = 0  # the steps that window held
    windows: int = 0  # windows observed
    pending: list[int] | None = None  # the last window's marginal re-plan: each share's move
    move: float = MOVE_FACTOR  # how far past its points a share may move (a trust region)
    # every plan measured since the speeds last changed: its step (s) and that mean's relative
    # standard error, its newest window's weighing most
    tried: list[dict] = field(default_factory=list)
    # how far a rank's window mean (`spread`) and its single step (`step_noise`) lie from its
    # point at that batch, as the standard deviation of their logarithm, smoothed over windows:
    # the host's noise, slow stretches included, which a window's own spread does not show
    spread: float = 0.0
    step_noise: float = 0.0
    last_plan: list[int] | None = None  # the plan of the newest window observed
    relearn: int = 0  # short windows left after a jump of speed during a trial
    jumped: bool = False  # a rank's speed jumped since the last proposal (`sudden_change`)
    counts: list[dict[int, int]] = field(default_factory=list)  # per rank: batch -> rows seen

    @property
    def margin(self) -> float:
        """The predicted gain (step before / step after - 1) a proposal must exceed: the
        largest of twice the standard error of a difference of two means of the plan's step
        (a window's, `_se`, over the square root of the windows its mean holds, two at most:
        the trial that follows measures as many or more), the model's own demonstrated error
        (the largest |measured / predicted - 1| of its last ERRORS_KEPT re-plans within the
        batches the ranks had run, `within_points`), and half the threshold (AdaptDL's 5% by
        default). A plan predicted 10% faster by a model that was 15% off last time is no
        evidence of a faster plan. A re-plan that extended the curves past their points (the
        first ones, from one point a rank) is verified, not counted: its error says nothing of
        the curves between the points it then measured."""
        entry = self._entry(self.last_plan)
        windows = min(entry["windows"], 2) if entry else 1
        se = self._se(self.noise, self.rows, entry) / math.sqrt(windows)
        measured = 2 * math.sqrt(2) * se if self.rows else 0.0
        demonstrated = max((abs(e) for e in self.errors), default=0.0)
        return max(self.threshold / 2, measured, demonstrated)

    @property
    def jump(self) -> float:
        """A change of a rank's window mean beyond this ratio is a change of speed, not noise: 1
        + 3 x `threshold`, or wider where its window means have spread more about its points
        (`JUMP_SIGMAS` x `spread`: a host that runs slow for a few windows does not look like
        a straggler)."""
        return jump_of(self.threshold, self.spread)

    @property
    def step_jump(self) -> float:
        """The same for a rank's single steps (`sudden_change`), from `step_noise`."""
        return jump_of(self.threshold, self.step_noise)

    def _entry(self, plan: Sequence[int] | None) -> dict | None:
        return entry_of(self.tried, plan)

    _se = staticmethod(window_se)

    @property
    def replans(self) -> int:
        """Plans adopted from the model (reverts of a failed one not counted)."""
        return sum("reverted" not in h for h in self.history)

    def window_rows(self, every: int) -> int:
        """The steps the next window holds: LEARNING_ROWS for the first LEARNING_WINDOWS, while
        the curves know one batch per rank and a re-plan is worth most, and after a jump of
        speed during a trial (`_jump_on_trial`); then `every`."""
        learning = self.windows < LEARNING_WINDOWS or self.relearn > 0
        return min(every, LEARNING_ROWS) if learning else every

    def curves(self) -> list[Curve]:
        """Each rank's step-time curve (the class docstring; `micro`: `curves.per_pass`)."""
        assert self.per_sample_s is not None
        points = self.points or [{} for _ in self.latency_s]
        return [
            Curve((a, c), tuple((per_pass(pts, cap) if self.micro else pts).items()), self.jump)
            for a, c, pts, cap in zip(
                self.latency_s, self.per_sample_s, points, self.caps, strict=True
            )
        ]

    def within_points(self, plan: Sequence[int]) -> bool:
        """Whether every share of `plan` lies within the batches its rank has run (its curve
        interpolated there, not extended)."""
        points = self.points or [{} for _ in plan]
        return all(
            b == 0 or (pts and min(pts) <= b <= max(pts))
            for b, pts in zip(plan, points, strict=True)
        )

    def step_times(self, plan: Sequence[int]) -> list[float]:
        """Each rank's predicted compute time under `plan` (0 for a rank left out: it computes
        nothing and waits for no one)."""
        return [
            cost_of(c, cap, self.micro)(b) if b else 0.0
            for c, b, cap in zip(self.curves(), plan, self.caps, strict=True)
        ]

    def observe(
        self,
        plan: Sequence[int],
        compute_s_per_step: Sequence[float],
        noise: float = 0.0,
        rows: int = 0,
        step_s: float | None = None,
        samples: Sequence[Sequence[float]] = (),
    ) -> None:
        """Feed each rank's mean compute time per step over a window of `rows` steps in which it
        ran `plan`, the spread of that window's steps (`noise`: the coefficient of variation
        of the slowest computing rank's time per step; 0 where not measured) and its mean step
        (`step_s`: the mean over its steps of the slowest computing rank's time, what the plan
        cost; default the slowest rank's mean), and its rows (`samples[step][rank]`, for the
        host's noise, `step_noise`). A plan on trial is judged here (`_judge`)."""
        step_s = max(compute_s_per_step) if step_s is None else step_s
        self.last_step_s = step_s
        self.noise, self.rows, self.windows = noise, rows, self.windows + 1
        self.relearn = max(self.relearn - 1, 0)
        self._learn_noise(plan, compute_s_per_step, samples)
        if self._learn_points(plan, compute_s_per_step, rows):
            self._speeds_changed()
        self._record(plan, step_s, noise, rows)
        self.last_plan = list(plan)
        if self.trial is not None and list(plan) == self.trial["new"]:
            self._judge(plan, step_s)
        if self.per_sample_s is None:
            self.per_sample_s = [
                max(t - a, 0.05 * t) / max(b, 1)
                for t, a, b in zip(compute_s_per_step, self.latency_s, plan, strict=True)
            ]

    def _learn_noise(
        self,
        plan: Sequence[int],
        means: Sequence[float],
        samples: Sequence[Sequence[float]],
    ) -> None:
        """`spread` and `step_noise` (`speed_change.host_noise`), smoothed over windows."""
        window, step = host_noise(self.points or [], plan, means, samples, self.jump)
        w = self.smoothing
        if window is not None:
            self.spread = window if not self.spread else w * window + (1 - w) * self.spread
        if step is not None:
            self.step_noise = step if not self.step_noise else w * step + (1 - w) * self.step_noise

    def _learn_points(
        self, plan: Sequence[int], compute_s_per_step: Sequence[float], rows: int
    ) -> bool:
        """Each computing rank's window mean into its curve's points; True where a rank's time
        at a batch it ran before moved beyond `jump` (its speed changed: its points dropped,
        and with them the plans rejected and the model's errors, measured at other speeds)."""
        if self.points is None:
            self.points = [{} for _ in plan]
        if len(self.counts) != len(plan):
            self.counts = [{} for _ in plan]
        w, changed = self.smoothing, False
        latest = list(self.latest) if self.latest is not None else list(plan)
        on_trial = self.trial is not None and list(plan) == self.trial["new"]
        for i, (pts, b, t) in enumerate(zip(self.points, plan, compute_s_per_step, strict=True)):
            if b == 0 or t <= 0:  # left out, or not computing in this window (a worker that
                continue  # joined after it began): its time says nothing of its speed
            latest[i] = b
            if b in pts and not on_trial and not 1 / self.jump <= t / pts[b] <= self.jump:
                # slower (or faster) at every batch alike (`speed_change.scaled`)
                pts, self.counts[i] = scaled(pts, self.counts[i], t / pts[b], rows, b)
                self.points[i], changed = pts, True
            if b in pts:  # a mean of the rows since the speed changed, the newest MEMORY_ROWS
                seen = min(self.counts[i].get(b, 0), MEMORY_ROWS - rows)
                pts[b] = (
                    (seen * pts[b] + rows * t) / (seen + rows) if rows else w * t + (1 - w) * pts[b]
                )
            else:
                pts[b] = t
            self.counts[i][b] = self.counts[i].get(b, 0) + rows
        self.latest = latest
        return changed

    def _record(self, plan: Sequence[int], step_s: float, noise: float, rows: int) -> None:
        record(self.tried, plan, step_s, noise, rows, self.smoothing, self.windows)

    def _judge(self, plan: Sequence[int], step_s: float) -> None:
        """The trial's verdict from its windows so far against the plan before it
        (`measured.judge`); the model's error at the batches it chose, from its first."""
        trial = self.trial
        verdict = judge(trial, step_s, self._se(self.noise, self.rows, self._entry(plan)))
        if trial["windows"] == 1 and trial.get("predicted_s") and trial.get("measured_range", True):
            # a plan beyond the batches the ranks had run was extrapolated, which says
            # nothing of the curves between them
            self.errors = [
                *self.errors[-(ERRORS_KEPT - 1) :],
                trial["after_s"] / trial["predicted_s"] - 1,
            ]
        back = verdict == "given up" and return_to(self.tried, self.windows, plan, trial["after_s"])
        if verdict is not None:
            self.trial = None
        if verdict == "kept" or (verdict == "given up" and back is None):
            # measurably faster, or within the noise and still the best plan measured lately
            self.move = min(MOVE_FACTOR, self.move * 2)
        elif back:
            # The model promised a shorter step and the windows show a plan measured lately
            # as faster: the model does not hold at these batches. Go back to that plan, do
            # not propose this one again lightly, and move less far next time.
            self.rejected.append(list(plan))
            self.revert_to = back
            self.move = max(LEAST_MOVE, self.move / 2)

    def sudden_change(
        self,
        rows: Sequence[Sequence[float]],
        plan: Sequence[int] | None = None,
        recent: int = SUDDEN_STEPS,
        reference: int = 3,
    ) -> bool:
        """Whether a rank's speed has jumped (`speed_change.jumps`): each of its last
        `recent` steps beyond `step_jump` of its median over the `reference` or more before.
        Three steps in a row, not one: a single slow step is noise (a page fault, the host),
        two paused steps in a row came about once in two runs on a shared host, and each
        further step a straggler runs on the old plan costs a step of its slow pace. A jump
        during a trial is taken in here (`_jump_on_trial`); any other stands for the second
        window a marginal proposal waits for (`jumped`, `propose`): its steps in a row beyond
        the noise confirmed it, and each window more runs the straggler's pace."""
        factors = jumps(rows, plan, self.step_jump, recent, reference)
        if factors is not None and self.trial is not None and list(plan or ()) == self.trial["new"]:
            self._jump_on_trial(factors, list(plan or ()))
        elif factors is not None:
            self.jumped = True
        return factors is not None

    def _jump_on_trial(self, factors: Sequence[float], plan: Sequence[int]) -> None:
        """A trial's own windows cannot tell a change of speed (its batches are new to its
        ranks, `_learn_points`): a straggler during a trial could leave the verdict open, and
        the plan, for the rest of the run. A jump beyond `jump` (not the host's noise): the
        window after is short, for the verdict to come soon. Beyond `jump` squared (no
        verdict across such speeds means anything): the trial ends, each jumped rank's
        points are scaled by its factor (`speed_change.scaled`), what measured the old
        speeds is dropped, and the re-plan need not wait for a second window (`propose`):
        another look at three steps beyond `jump` squared would cost a window at its pace."""
        if not any(not 1 / self.jump <= f <= self.jump for f in factors):
            return
        self.relearn = 2  # this jump's own window, and the one after
        big = self.jump**2
        if self.points is None or all(1 / big <= f <= big for f in factors):
            return
        pts, counts = self.points, self.counts
        for i, (f, b) in enumerate(zip(factors, plan, strict=True)):
            if f != 1.0:  # the trial's own batch measured afresh
                pts[i], counts[i] = scaled(pts[i], counts[i], f, SUDDEN_STEPS, b)
        self._speeds_changed()
        self.jumped = True

    def _speeds_changed(self) -> None:
        """Drop what measured other speeds; the shares' bounded move back to its widest."""
        self.tried, self.trial = [], None
        self.rejected, self.errors, self.move = [], [], MOVE_FACTOR

    def imbalance(self, plan: Sequence[int]) -> float:
        """How far the slowest rank's predicted step lies above the mean of the ranks that
        compute (a rank left out, batch 0, waits for no one and is not in the mean)."""
        times = [t for t, b in zip(self.step_times(plan), plan, strict=True) if b]
        mean = sum(times) / len(times) if times else 0.0
        return max(times) / mean - 1 if mean > 0 else 0.0

    def propose(
        self,
        plan: Sequence[int],
        step: int,
        steps_left: int | None = None,
        switch_s: float = 0.0,
    ) -> list[int] | None:
        """A new plan, or None where the current one is good enough: its ranks balanced within
        `margin` and none left out, or no plan predicted to gain more than its bar
        (`measured.gain_bar`: more to bring a rank back, its copy `switch_s` over `steps_left`).
        A plan that leaves a rank out is looked at again every window: the others slowing down
        can make it worth its cost again."""
        jumped, self.jumped = self.jumped, False
        if self.revert_to is not None:
            back, self.revert_to = self.revert_to, None
            if back != list(plan):
                self.history.append({"step": step, "plan": back, "reverted": list(plan)})
                return back
        if self.points is None or self.trial is not None:  # a plan on trial is measured first
            return None
        current = self.imbalance(plan)
        if current <= self.margin and 0 not in plan:
            return None
        names = [f"rank {i}" for i in range(len(plan))]
        new, self.excluded = balance_on_curves(
            self.curves(), self.global_batch, self.caps, names, self.micro, move=self.move
        )
        before, after = max(self.step_times(plan)), max(self.step_times(new))
        gain = before / after - 1 if after > 0 else 0.0
        bar = gain_bar(self.margin, len(self.rejected), plan, new, after, steps_left, switch_s)
        if new == list(plan) or new in self.rejected or gain <= bar:
            self.pending = None
            return None
        moves = [(n > b) - (n < b) for n, b in zip(new, plan, strict=True)]
        agree = jumped or self._agrees(moves)
        if gain <= CLEAR_GAIN * bar and not agree:  # marginal: the next window must propose
            self.pending = moves  # no share moving the other way
            return None
        self.pending, entry = None, self._entry(plan)
        se = self._se(self.noise, self.rows, entry)
        self.trial = start_trial(
            plan,
            new,
            entry,
            se,
            step_s=self.last_step_s,
            predicted_s=after,
            measured_range=self.within_points(new),
        )
        self.history.append(
            {
                "step": step,
                "plan": new,
                "imbalance_before": round(current, 4),
                "predicted_speedup": round(before / after, 4),
                "margin": round(bar, 4),
                **({"excluded": self.excluded} if self.excluded else {}),
            }
        )
        return new

    def _agrees(self, moves: Sequence[int]) -> bool:
        """Whether the last window's marginal proposal moved no share the other way (a jump
        of speed since stands for it: `sudden_change`, `propose`)."""
        pending = self.pending
        return pending is not None and all(a * b >= 0 for a, b in zip(pending, moves, strict=True))

    def state(self) -> dict:
        """What a checkpoint keeps, for a resumed run to re-plan alike (`rebalancer_state`)."""
        return state_of(self)

    restore = restore_from
