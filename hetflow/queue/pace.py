"""A running job's step time as the queue sees it from outside, and the unit it gives a prior.

Where the allocator places a job without measuring it first (no profile history for its
kinds), its step-time lines come from a prior (`training.plan.prior`: the published ratios of
each worker's preset, else the equal split): the prior orders the kinds, but its seconds are
not the host's (a published curve is another model on another device). The job's own steps
set the unit: rank 0's progress, sampled as the run writes it (`Pace.observe`), gives its
step time on the workers it holds, and that over the step the prior's lines predict there is
the factor every line of the prior is scaled by (`scaled`), for that job and every other job
of the same recipe whose lines are still the prior's. What the prior gets wrong between kinds
stays wrong: one pace on one set of workers measures one factor, not a kind's own line.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from hetflow.queue.jobs import Job, Line

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
    lines = {k: Line(v.fixed_s * factor, v.per_sample_s * factor) for k, v in job.lines.items()}
    return replace(job, lines=lines)
