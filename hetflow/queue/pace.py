"""What a running job's steps tell the queue of its recipe's step-time lines.

Where the allocator places a job without measuring it first (no profile history for its
kinds), its step-time lines come from a prior (`training.plan.prior`: the published ratios of
each worker's preset, else the equal split): the prior may order the kinds wrongly, and its
seconds are not the host's (a published curve is another model on another device). The
jobs' own steps correct both (`Learned.model`), for every job of the recipe:

- each kind a job has run on gets its own line, fitted from the points the job's re-balancer
  learned of its workers of that kind (`kind_lines`, from the run's points.json), and the
  kinds no job has run on yet the prior's, scaled by the median ratio of the measured lines
  to the prior's;
- the first job of the recipe that runs is timed on the workers it holds, from rank 0's
  progress sampled as the run writes it (`Pace.observe`): the points are compute alone,
  short of a step (its data, all-reduce and overheads), so every line is scaled by that
  step over the model's step there (`scaled`; the ring's latency term is not). Where the
  points cannot be read (rank 0 on another node), that sets the unit of the prior alone.
"""

from __future__ import annotations

import statistics
from collections.abc import Mapping
from dataclasses import dataclass, field, replace

from hetflow.queue.allocate import step_s
from hetflow.queue.jobs import Job, Kind, Line
from hetflow.training.plan.learned import learned_rank

SKIP_STEPS = 2  # the first steps a pace sees of a segment or a new set of workers: their warm-up
PACE_STEPS = 4  # steps timed for a pace


@dataclass
class Pace:
    """The step time of one job on one set of `workers`, from `(step, time)` samples of its
    progress (`observe`): timed from the first sample at least `skip` steps after the first
    one seen, once `steps` more are done.

    >>> p = Pace(("a",))
    >>> [p.observe(s, t) for s, t in [(3, 0.0), (4, 1.0), (5, 1.2), (7, 1.6), (9, 2.0)]]
    [None, None, None, None, 0.2]
    """

    workers: tuple[str, ...]
    skip: int = SKIP_STEPS
    steps: int = PACE_STEPS
    seen: int | None = None  # the step it was at when first seen
    since: tuple[int, float] | None = None  # the step its timing starts at, and when

    def observe(self, step: int, at: float) -> float | None:
        """Seconds a step, once `steps` steps are timed; None before."""
        if self.seen is None or step < self.seen:  # first seen, or a new segment's resume
            self.seen, self.since = step, None
            return None
        if step < self.seen + self.skip:
            return None
        if self.since is None:
            self.since = (step, at)
            return None
        done = step - self.since[0]
        return (at - self.since[1]) / done if done >= self.steps else None


def scaled(job: Job, factor: float) -> Job:
    """`job` with every step-time line multiplied by `factor`.

    >>> j = scaled(Job("j", "low", 8, 10, 1.0, {"t4": Line(0.01, 0.002)}), 50.0)
    >>> j.lines["t4"]
    Line(fixed_s=0.5, per_sample_s=0.1)
    """
    return replace(job, lines={k: scaled_line(v, factor) for k, v in job.lines.items()})


def kind_lines(
    points: Mapping[str, Mapping[int, float]], kinds: Mapping[str, str]
) -> dict[str, Line]:
    """Each kind's line from its workers' `points` (worker -> batch -> compute seconds;
    `kinds`: worker -> kind, a worker not in it left out): the mean over the kind's workers
    at each batch, fitted as a run's own points are (`learned.learned_rank`: a line through
    two batches or more, proportional through one).

    >>> kind_lines({"a": {16: 0.2, 32: 0.36}, "b": {16: 0.1}, "x": {8: 1.0}},
    ...            {"a": "t4", "b": "a100"})
    {'t4': Line(fixed_s=0.04, per_sample_s=0.01), 'a100': Line(fixed_s=0.0, per_sample_s=0.00625)}
    """
    by_kind: dict[str, dict[int, list[float]]] = {}
    for worker, pts in points.items():
        if worker in kinds:
            for b, t in pts.items():
                by_kind.setdefault(kinds[worker], {}).setdefault(b, []).append(t)
    out = {}
    for kind, pts in by_kind.items():
        means = {b: statistics.mean(ts) for b, ts in sorted(pts.items())}
        r = learned_rank(0, means, max(means))  # the line alone: any reference batch
        if r is not None:
            out[kind] = Line(round(r.fit_latency_s, 12), round(r.fit_s_per_sample, 12))
    return out


@dataclass
class Learned:
    """What a recipe's running jobs measured: `lines`, per kind, from their re-balancers'
    points (`kind_lines`: compute alone, so the ratios between kinds); `pace`, a job's step
    time on the kinds it held at its global batch (`Pace`: the whole step, so the level)."""

    lines: dict[str, Line] = field(default_factory=dict)
    pace: tuple[tuple[Kind, ...], float, int] | None = None

    def model(self, prior: Job) -> Job:
        """`prior` (a job's model as its prior gave it) with each measured kind's line and the
        other kinds' scaled by the median ratio of the measured lines to the prior's at the
        job's share on each kind (`global_batch` over the kinds); then, where a job paced,
        every line scaled so that the model's step on the kinds it paced on, at its batch, is
        the step it measured. As it is where neither.

        >>> t4, a100 = Kind("t4", 16.0), Kind("a100", 80.0)
        >>> prior = Job("j", "low", 64, 10, 1.0, {"t4": Line(0.0, 0.002), "a100": Line(0.0, 0.001)})
        >>> Learned({"t4": Line(0.0, 0.004)}).model(prior).lines["a100"]
        Line(fixed_s=0.0, per_sample_s=0.002)
        >>> paced = Learned({"t4": Line(0.0, 0.004)}, ((t4,), 0.512, 64)).model(prior)
        >>> [round(line.per_sample_s, 6) for line in paced.lines.values()]
        [0.008, 0.004]
        """
        b = max(1, prior.global_batch // max(1, len(prior.lines)))
        known = [k for k in self.lines if k in prior.lines]
        base = prior
        if known:
            ratio = statistics.median(
                self.lines[k].curve.time(b) / prior.lines[k].curve.time(b) for k in known
            )
            lines = {k: self.lines.get(k) or scaled_line(v, ratio) for k, v in prior.lines.items()}
            base = replace(prior, lines=lines)
        if self.pace is None:
            return base
        kinds, took, batch = self.pace
        modelled = step_s(replace(base, global_batch=batch), kinds)
        return scaled(base, took / modelled) if modelled > 0 else base


def scaled_line(line: Line, factor: float) -> Line:
    """`line` times `factor`."""
    return Line(line.fixed_s * factor, line.per_sample_s * factor)
