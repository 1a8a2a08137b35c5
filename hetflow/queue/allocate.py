"""Which workers each job holds.

The objective is Gavel's normalised throughput, each job's throughput on its workers over its
throughput alone on the whole cluster, summed as `sum_j w_j log(X_j / X_j_alone)` (weighted
proportional fairness) rather than as a plain weighted sum: with data-parallel speed-ups a
plain sum hands each worker to the one job it helps most and leaves the others waiting, where
the log gives each more worker a diminishing return and every job that fits somewhere runs.
Priority is respected first: a job without workers gets its first one in priority order
before any job grows, so a higher-priority job never waits while a lower-priority one holds a
worker that holds it. Within a class, the job that would lose most on its second-best kind
picks first (then arrival order), so the kind a job gains most on goes to it. Growth is
greedy: the worker that raises the objective most, until no worker raises it by `min_gain`;
then two jobs exchange workers (one handed over, or two of different kinds swapped) while
an exchange raises the objective: a job that took a fast kind first, gaining little there,
hands it to one that gains more.

A job's throughput on a set of workers is the planner's: the batch balanced on the workers'
step-time lines (the performance model's solver, `hetflow.perf.balance.balanced_time`) plus
the ring all-reduce of its gradient (`hetflow.perf.collective`), so fixed costs and
communication make more workers help less, and a worker too slow to help is never added.

>>> from hetflow.queue.jobs import Job, Kind, Line
>>> kinds = {"fast": Kind("fast", 40), "slow": Kind("slow", 16)}
>>> workers = {"f0": "fast", "s0": "slow", "s1": "slow"}
>>> cnn = Job("cnn", "normal", 32, 100, 1, {"fast": Line(0.01, 1e-3), "slow": Line(0.01, 2e-3)})
>>> gpt = Job("gpt", "high", 32, 100, 20, {"fast": Line(0.01, 1e-3), "slow": Line(0.01, 1e-2)})
>>> allocate([cnn, gpt], workers, kinds)
{'cnn': ['s0', 's1'], 'gpt': ['f0']}
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence

from hetflow.perf.balance import balanced_time
from hetflow.queue.jobs import Job, Kind, fits
from hetflow.queue.jobs import allreduce_s as _allreduce_s

Holding = dict[str, list[str]]  # job name -> the workers it holds, in the cluster's order
MIN_GAIN = 0.01  # the least rise of the objective a worker must bring to be added


def step_s(job: Job, kinds: Sequence[Kind]) -> float:
    """One step of `job` on workers of `kinds` (one entry a worker): the balanced compute
    step plus the all-reduce; inf on none."""
    if not kinds:
        return math.inf
    compute = balanced_time([job.lines[k.name].curve for k in kinds], job.global_batch)
    return compute + _allreduce_s(job, list(kinds))


def throughput(job: Job, kinds: Sequence[Kind]) -> float:
    """Samples a second of `job` on workers of `kinds`; 0 on none."""
    return 0.0 if not kinds else job.global_batch / step_s(job, kinds)


def usable(job: Job, kind: Kind) -> bool:
    """Whether a worker of `kind` can hold `job` and its speed there is known."""
    return fits(job, kind) and kind.name in job.lines


def alone(job: Job, workers: Mapping[str, str], kinds: Mapping[str, Kind]) -> float:
    """`job`'s throughput alone on the whole cluster, on the workers the allocator gives it
    there (all of them, less those that would slow it)."""
    held = allocate([job], workers, kinds, min_gain=1e-9)[job.name]
    return throughput(job, [kinds[workers[w]] for w in held])


def normalised(
    job: Job, names: Iterable[str], workers: Mapping[str, str], kinds: Mapping[str, Kind]
) -> float:
    """`job`'s throughput on `names` over its throughput alone on the whole cluster."""
    best = alone(job, workers, kinds)
    got = throughput(job, [kinds[workers[w]] for w in names])
    return got / best if best > 0 else 0.0


class _Allocation:
    """One allocation in the making: what each job holds, the free workers (see `allocate`)."""

    def __init__(self, jobs, workers, kinds, fixed, held, allowed, kept) -> None:
        self.workers, self.kinds, self.allowed, self.held = workers, kinds, allowed, held
        self.jobs = jobs
        self.out: Holding = {j.name: list(fixed.get(j.name) or kept.get(j.name, ())) for j in jobs}
        self.pinned = {w for names in kept.values() for w in names}
        taken = {w for names in self.out.values() for w in names}
        self.free = [w for w in workers if w not in taken]
        self.others_held = {w for names in held.values() for w in names}

    def kinds_of(self, names: Iterable[str]) -> list[Kind]:
        return [self.kinds[self.workers[w]] for w in names]

    def candidates(self, job: Job) -> dict[str, str]:
        """Per kind, the free worker `job` would take: one it holds now, else one no job
        holds now, else the first."""
        may = set(self.allowed[job.name]) if job.name in self.allowed else None
        mine = set(self.held.get(job.name, ()))
        pick: dict[str, str] = {}
        for w in sorted(self.free, key=lambda w: (w not in mine, w in self.others_held)):
            kind = self.kinds[self.workers[w]]
            if kind.name not in pick and usable(job, kind) and (may is None or w in may):
                pick[kind.name] = w
        return pick

    def regret(self, job: Job) -> float:
        """How much slower `job` runs on its second-best free kind than on its best."""
        speeds = sorted(
            (throughput(job, [self.kinds[k]]) for k in self.candidates(job)), reverse=True
        )
        return math.log(speeds[0] / speeds[1]) if len(speeds) > 1 else math.inf

    def gain(self, job: Job, kind: str) -> float:
        """The objective's rise if `job` takes a worker of `kind`."""
        now = self.kinds_of(self.out[job.name])
        before, after = throughput(job, now), throughput(job, [*now, self.kinds[kind]])
        if before <= 0:
            return math.inf if after > 0 else 0.0
        return job.weight * math.log(after / before) if after > 0 else -math.inf

    def give(self, job: Job, worker: str) -> None:
        self.out[job.name].append(worker)
        self.free.remove(worker)

    def first_workers(self, jobs: Sequence[Job]) -> None:
        """Class by class, each waiting job its first worker: the job that loses most if it
        misses its best kind first (ties: the earliest arrival), on its best kind."""
        for rank in sorted({j.rank for j in jobs}):
            waiting = [j for j in jobs if j.rank == rank and not self.out[j.name]]
            waiting = [j for j in waiting if self.candidates(j)]
            while waiting:
                job = max(waiting, key=self.regret)
                pick = self.candidates(job)
                self.give(job, pick[max(pick, key=lambda k: throughput(job, [self.kinds[k]]))])
                waiting = [j for j in waiting if j is not job and self.candidates(j)]

    def grow(self, growing: Sequence[Job], min_gain: float) -> None:
        """The worker that raises the objective most, while it raises it by `min_gain`."""
        while self.free:
            moves = [
                (self.gain(j, k), i, w)
                for i, j in enumerate(growing)
                for k, w in self.candidates(j).items()
            ]
            if not moves:
                return
            g, i, worker = max(moves, key=lambda m: (m[0], -m[1]))
            if g < min_gain:
                return
            self.give(growing[i], worker)

    def utility(self, job: Job, names: Sequence[str]) -> float:
        x = throughput(job, self.kinds_of(names))
        return job.weight * math.log(x) if x > 0 else -math.inf

    def may_hold(self, job: Job, worker: str) -> bool:
        """Whether an exchange may hand `worker` to `job`: its kind holds the job, the job
        may be given it, and no job of a higher class that waits (none yet) could hold it."""
        may = self.allowed.get(job.name)
        kind = self.kinds[self.workers[worker]]
        waiting = [j for j in self.jobs if j.rank < job.rank and not self.out[j.name]]
        outranked = any(usable(j, kind) for j in waiting)
        return usable(job, kind) and (may is None or worker in set(may)) and not outranked

    def exchanges(self, a: Job, b: Job):
        """The holdings of `a` and `b` after each exchange between them: one of `a`'s workers
        handed to `b` (`a` keeps one at least), or swapped for one of `b`'s of another kind;
        never a worker its job keeps (`allocate`'s `kept`)."""
        mine, theirs = self.out[a.name], self.out[b.name]
        for x in mine:
            if x in self.pinned or not self.may_hold(b, x):
                continue
            if len(mine) > 1:
                yield [w for w in mine if w != x], [*theirs, x]
            for y in theirs:
                swappable = y not in self.pinned and self.workers[x] != self.workers[y]
                if swappable and self.may_hold(a, y):
                    yield [y if w == x else w for w in mine], [x if w == y else w for w in theirs]

    def improve(self, movable: Sequence[Job]) -> bool:
        """The exchange of workers between two jobs that raises the objective most, if one
        does by `MIN_GAIN`; True when one was made."""
        best, pick = MIN_GAIN, None
        for a in movable:
            for b in movable:
                if a is b:
                    continue
                now = self.utility(a, self.out[a.name]) + self.utility(b, self.out[b.name])
                for na, nb in self.exchanges(a, b):
                    rise = self.utility(a, na) + self.utility(b, nb) - now
                    if rise > best:
                        best, pick = rise, (a, b, na, nb)
        if pick is None:
            return False
        a, b, na, nb = pick
        self.out[a.name], self.out[b.name] = na, nb
        return True


def allocate(
    jobs: Sequence[Job],
    workers: Mapping[str, str],
    kinds: Mapping[str, Kind],
    fixed: Mapping[str, Sequence[str]] | None = None,
    held: Mapping[str, Sequence[str]] | None = None,
    allowed: Mapping[str, Iterable[str]] | None = None,
    min_gain: float = MIN_GAIN,
    kept: Mapping[str, Sequence[str]] | None = None,
) -> Holding:
    """Each of `jobs` (in arrival order) with the workers it holds, from `workers` (name ->
    kind, in the cluster's order).

    `fixed`: jobs whose workers do not change (they keep these and take no more); `held`: what
    each job holds now, preferred among workers of a kind (fewer moves); `allowed`: the only
    workers a job may be given (a job resumes from its checkpoint on some of the workers it
    was taken on, never new ones); `kept`: workers a job keeps whatever else changes (it
    starts with them, before any job gets its first worker, and may grow from there; no
    exchange takes them from it: a running elastic job kept on some of its own workers moves
    in place, `switch.decide`). Every worker goes to at most one job, every job only to
    workers whose kind holds it and whose step time for it is known.
    """
    fixed = fixed or {}
    a = _Allocation(jobs, workers, kinds, fixed, held or {}, allowed or {}, kept or {})
    a.first_workers(jobs)
    movable = [j for j in jobs if j.name not in fixed and a.out[j.name]]
    a.grow(movable, min_gain)
    for _ in range(2 * len(workers)):  # each exchange raises the objective: a few suffice
        if not a.improve(movable):
            break
    order = {w: i for i, w in enumerate(workers)}
    return {name: sorted(names, key=order.__getitem__) for name, names in a.out.items()}


def objective(jobs: Sequence[Job], holding: Mapping[str, Sequence[str]], workers, kinds) -> float:
    """Gavel's weighted sum of normalised throughputs of `holding` (what the switch rule
    weighs; a job without workers adds 0)."""
    return sum(j.weight * normalised(j, holding.get(j.name, ()), workers, kinds) for j in jobs)
