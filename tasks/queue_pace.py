"""The allocator's step-time lines learned from the jobs' own steps, where the session placed
them from a prior with nothing measured first (`hetflow.queue.pace`; `tasks.queue.job_prior`):
each kind's line from the points a running job's re-balancer wrote (`progress.read_points`,
the run's points.json on this host), and until one is, the unit from its progress
(`StopChannel.progress_at`: on this host the time rank 0 wrote it; on Ray, the board's)."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping

from hetflow.config.queue import QueueJob
from hetflow.queue.jobs import Job
from hetflow.queue.pace import Learned, Pace, kind_lines


class Units:
    """Per recipe, what its jobs' steps measured (`learned`: each kind's line, the unit a pace
    gave; `found`: each kind learned and each unit set, when and from which job, for the
    session's figures); each job's model as its prior gave it (`priors`), and each running
    job's pace on the workers it holds."""

    def __init__(self) -> None:
        self.learned: dict[str, Learned] = {}
        self.found: list[dict] = []
        self.priors: dict[str, Job] = {}
        self.paces: dict[str, Pace] = {}
        self.read: dict[str, int] = {}  # job -> the step of the points last read of its run

    def admit(self, job: QueueJob, model: Job, prior: bool) -> Job:
        """`model` with what its recipe's jobs measured where its lines are a `prior`'s
        (`Learned.model`; the job is in `priors` then), else as it is."""
        if not prior:
            return model
        self.priors[job.name] = model
        return self.learned.setdefault(job.recipe, Learned()).model(model)

    def observe(
        self,
        jobs: Iterable,
        progress_at: Callable,
        points_at: Callable,
        kinds_of: Callable,
        kind_of: Mapping[str, str],
        settled: Callable,
        now_s: float,
    ) -> bool:
        """Each running job of `jobs` (the session's `Live`s) whose lines are a prior's: the
        points its re-balancer wrote since last read (`points_at(job)`: (step, worker ->
        points), or None), fitted per kind (`kind_of`: worker -> kind); and, until its recipe
        has one, its pace on the workers it holds (where `settled`: none of them still
        joining). Every job of a recipe that learned something
        is modelled again (`Learned.model`). True when a recipe learned a kind's line or its
        pace for the first time (the allocator should decide again)."""
        jobs = list(jobs)
        changed: set[str] = set()
        first = False
        for j in jobs:
            if j.job.name not in self.priors or j.future is None or not j.workers:
                continue
            recipe, name = j.job.recipe, j.job.name
            learned = self.learned.setdefault(recipe, Learned())
            got = points_at(j)
            if got is not None and got[0] != self.read.get(name):
                self.read[name] = got[0]
                lines = kind_lines(got[1], kind_of)
                for kind in sorted(set(lines) - set(learned.lines)):
                    self._found(name, now_s, kind=kind, line=lines[kind])
                    first = True
                learned.lines.update(lines)
                changed.add(recipe)
            if learned.pace is not None:
                continue
            took = self._pace(j, progress_at, settled)
            if took is not None:
                learned.pace = (tuple(kinds_of(j.workers)), took, j.job.global_batch)
                self._found(name, now_s, step_s=took, on=sorted(j.workers))
                changed.add(recipe)
                first = True
        for o in jobs:
            if o.job.name in self.priors and o.job.recipe in changed:
                o.model = self.learned[o.job.recipe].model(self.priors[o.job.name])
        return first

    def _pace(self, j, progress_at: Callable, settled: Callable) -> float | None:
        """`j`'s step time on the workers it holds, once paced (`Pace`); None before."""
        key = tuple(sorted(j.workers))
        pace = self.paces.get(j.job.name)
        if pace is None or pace.workers != key or not settled(j):
            self.paces[j.job.name] = pace = Pace(key)
        seen = progress_at(j)
        return None if seen is None else pace.observe(*seen)

    def _found(self, job: str, now_s: float, **what) -> None:
        """A kind's line or a unit learned from `job`'s steps, in `found` and said."""
        line = what.pop("line", None)
        if line is not None:
            what["line"] = [line.fixed_s, line.per_sample_s]
            said = f"{what['kind']}'s line, {line.fixed_s:.4g} s + {line.per_sample_s:.4g} s/sample"
        else:
            said = f"a step in {what['step_s']:.3f} s on {', '.join(what['on'])}"
        self.found.append({"job": job, "at_s": round(now_s, 2), **what})
        print(f"queue: {job}'s steps measured {said}")
