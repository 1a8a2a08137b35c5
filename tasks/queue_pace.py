"""The allocator's step-time lines put in seconds by the jobs' own steps, where the session
placed them from a prior with nothing measured first (`hetflow.queue.pace`; `tasks.queue.
job_prior`). Reads each running job's progress through its run's stop channel
(`StopChannel.progress_at`: on this host the time rank 0 wrote it)."""

from __future__ import annotations

from collections.abc import Callable, Iterable

from hetflow.config.queue import QueueJob
from hetflow.queue.allocate import step_s
from hetflow.queue.jobs import Job
from hetflow.queue.pace import Pace, scaled


class Units:
    """Per recipe, the factor from a prior's unit to seconds once a job of the recipe has
    paced (`factors`; `found`: when and from which job, for the session's figures), and each
    running job's pace on the workers it holds."""

    def __init__(self) -> None:
        self.factors: dict[str, float] = {}
        self.found: list[dict] = []
        self.paces: dict[str, Pace] = {}

    def admit(self, job: QueueJob, model: Job, prior: bool) -> tuple[Job, bool]:
        """`model` in seconds where its lines are a `prior`'s and its recipe's factor is
        known; and whether its lines still wait for one."""
        factor = self.factors.get(job.recipe)
        if prior and factor is not None:
            return scaled(model, factor), False
        return model, prior

    def observe(
        self, jobs: Iterable, progress_at: Callable, kinds_of: Callable, settled: Callable, now_s
    ) -> bool:
        """Each running job of `jobs` (the session's `Live`s) whose lines are still a prior's
        paced on the workers it holds, where `settled` (no worker of it still joining: a
        pace restarts then); the first pace of a recipe sets its factor, and every job of
        the recipe whose lines are a prior's is scaled by it. True when any was.
        `progress_at(job)`: its run's `(step, time)`, or None."""
        jobs = list(jobs)
        changed = False
        for j in jobs:
            if not j.prior or j.future is None or not j.workers:
                continue
            key = tuple(sorted(j.workers))
            pace = self.paces.get(j.job.name)
            if pace is None or pace.workers != key or not settled(j):
                self.paces[j.job.name] = pace = Pace(key)
            seen = progress_at(j)
            took = None if seen is None else pace.observe(*seen)
            if took is None:
                continue
            factor = took / step_s(j.model, kinds_of(j.workers))
            self.factors[j.job.recipe] = factor
            self.found.append(
                {"job": j.job.name, "at_s": round(now_s, 2), "step_s": took, "factor": factor}
            )
            for o in jobs:
                if o.prior and o.job.recipe == j.job.recipe:
                    o.model, o.prior = scaled(o.model, factor), False
            print(
                f"queue: {j.job.name} steps in {took:.3f} s on {', '.join(key)}: its recipe's "
                f"lines from the prior scaled by {factor:.3g} to seconds"
            )
            changed = True
        return changed
