"""The queue's policies replayed on the step-time model, event by event (pure).

Each job runs at the step time `allocate.step_s` gives it on the workers it holds. Events are
an arrival, a job's end, a job reaching the checkpoint it was told to stop at, and a restart
finished; the policy decides at each arrival and end. Costs charged:

- every start, the first and each restart, holds the job's workers idle for `restart_s`
  (launch, checkpoint load, warm-up);
- a job told to give up workers (or to take others) keeps them until its next checkpoint,
  where it stops (no step is redone) and restarts on its new workers; the job waiting for
  them waits as long.

Policies: `fifo` (`hetflow.queue.fifo`: arrival order, each job the `request` first free
workers that hold it, blind to their speed; runs to its end), `packed` (the allocator on the
free workers at each event; a running job keeps its workers to its end), `preempt` (the
allocator over every job at each event, a running job of the highest class kept as it is; a
move only when `switch.choose` finds it worth its restarts).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from hetflow.queue.allocate import Holding, step_s
from hetflow.queue.fifo import fifo
from hetflow.queue.jobs import Job, Kind
from hetflow.queue.switch import decide

POLICIES = ("fifo", "packed", "preempt")
EPS = 1e-9


@dataclass(frozen=True)
class Arrival:
    """A job, when it arrives (seconds from the start) and how many workers it asks for (what
    `fifo` gives it)."""

    job: Job
    at_s: float
    request: int


@dataclass
class Track:
    """One job as the replay runs it."""

    arrival: Arrival
    done: float = 0.0  # steps done
    workers: list[str] = field(default_factory=list)  # held now
    target: list[str] | None = None  # what it moves to at its next checkpoint
    ready_at: float | None = None  # restarting until then
    started_s: float | None = None  # its first step
    finished_s: float | None = None
    starts: int = 0
    redone: float = 0.0  # steps done past the last checkpoint when it stopped
    history: list[tuple[float, float, tuple[str, ...]]] = field(default_factory=list)

    @property
    def job(self) -> Job:
        return self.arrival.job

    @property
    def running(self) -> bool:
        return bool(self.workers) and self.ready_at is None and self.finished_s is None

    def next_checkpoint(self) -> float:
        k = self.job.checkpoint_every
        return min(self.job.steps, (math.floor(self.done / k + EPS) + 1) * k)


@dataclass(frozen=True)
class Outcome:
    """A policy's figures: each job's completion time (end - arrival) and wait to its first
    step, the makespan, restarts (beyond each job's first start), steps redone, and who held
    which worker when (`(job, worker, from_s, to_s)`)."""

    policy: str
    jct_s: dict[str, float]
    wait_s: dict[str, float]
    makespan_s: float
    restarts: int
    restart_s: float
    redone_steps: float
    spans: list[tuple[str, str, float, float]]

    @property
    def avg_jct_s(self) -> float:
        return sum(self.jct_s.values()) / len(self.jct_s)


class _Replay:
    """The event loop of `replay` (see the module)."""

    def __init__(self, arrivals, workers, kinds, policy: str, restart_s: float) -> None:
        if policy not in POLICIES:
            raise ValueError(f"policy: one of {', '.join(POLICIES)}, not {policy!r}")
        self.tracks = [Track(a) for a in sorted(arrivals, key=lambda a: a.at_s)]
        self.workers, self.kinds, self.policy, self.restart_s = workers, kinds, policy, restart_s
        self.t = min(a.at_s for a in arrivals) - 1.0
        self.stop_at: dict[str, float] = {}
        self.open: dict[str, tuple[str, float]] = {}
        self.spans: list[tuple[str, str, float, float]] = []

    def active(self) -> list[Track]:
        return [
            tr for tr in self.tracks if tr.arrival.at_s <= self.t + EPS and tr.finished_s is None
        ]

    def rate(self, tr: Track) -> float:
        """Steps a second on the workers it holds."""
        return 1.0 / step_s(tr.job, [self.kinds[self.workers[w]] for w in tr.workers])

    def held(self) -> set[str]:
        return {w for tr in self.tracks for w in tr.workers}

    def next_time(self) -> float:
        times = [tr.arrival.at_s for tr in self.tracks if tr.arrival.at_s > self.t + EPS]
        for tr in self.tracks:
            if tr.ready_at is not None:
                times.append(tr.ready_at)
            elif tr.running:
                times.append(self.t + (self.stop_at[tr.job.name] - tr.done) / self.rate(tr))
        return min(times)

    def start(self, tr: Track, names: list[str]) -> None:
        tr.workers, tr.target, tr.ready_at = list(names), None, self.t + self.restart_s
        tr.starts += 1
        self.stop_at[tr.job.name] = tr.job.steps
        for w in names:
            self.open[w] = (tr.job.name, self.t)

    def release(self, tr: Track, keep: list[str]) -> None:
        for w in [w for w in tr.workers if w not in keep]:
            job, since = self.open.pop(w)
            self.spans.append((job, w, since, self.t))
        tr.workers = [w for w in tr.workers if w in keep]

    def stop(self, tr: Track) -> bool:
        """`tr` at the end of its launch: done, or on to its target (or the same workers) at
        this checkpoint. True when the queue should decide again."""
        k = tr.job.checkpoint_every
        tr.done = self.stop_at[tr.job.name]
        if tr.done >= tr.job.steps - EPS:
            tr.finished_s = self.t
            self.release(tr, [])
            return True
        tr.redone += tr.done - math.floor(tr.done / k + EPS) * k
        nxt = tr.workers if tr.target is None else tr.target
        for w in tr.workers:  # the segment's own span ends here; the next one opens anew
            job, since = self.open.pop(w)
            self.spans.append((job, w, since, self.t))
        tr.workers, tr.target = [], list(nxt)
        return not nxt

    def step(self) -> None:
        t = self.next_time()
        for tr in self.tracks:
            if tr.running:
                tr.done += (t - self.t) * self.rate(tr)
        self.t, decide = t, False
        for tr in self.tracks:
            if tr.ready_at is not None and tr.ready_at <= t + EPS:
                tr.ready_at = None
                tr.started_s = t if tr.started_s is None else tr.started_s
        for tr in self.tracks:
            if tr.running and tr.done >= self.stop_at[tr.job.name] - EPS * 1e3:
                decide |= self.stop(tr)
        decide |= any(abs(tr.arrival.at_s - t) <= EPS for tr in self.tracks)
        if decide:
            self.apply(decide_for(self))
        busy = self.held()
        for tr in self.active():
            if not tr.workers and tr.target and not busy & set(tr.target):
                self.start(tr, tr.target)
                busy |= set(tr.workers)

    def apply(self, targets: Holding) -> None:
        for tr in self.active():
            got = targets.get(tr.job.name, [])
            if tr.workers:
                tr.target = None if sorted(got) == sorted(tr.workers) else got
                if tr.target is not None:
                    self.stop_at[tr.job.name] = tr.next_checkpoint()
            else:
                tr.target = got

    def outcome(self) -> Outcome:
        first = min(tr.arrival.at_s for tr in self.tracks)
        return Outcome(
            policy=self.policy,
            jct_s={tr.job.name: tr.finished_s - tr.arrival.at_s for tr in self.tracks},
            wait_s={tr.job.name: tr.started_s - tr.arrival.at_s for tr in self.tracks},
            makespan_s=max(tr.finished_s for tr in self.tracks) - first,
            restarts=sum(tr.starts - 1 for tr in self.tracks),
            restart_s=sum(tr.starts - 1 for tr in self.tracks) * self.restart_s,
            redone_steps=sum(tr.redone for tr in self.tracks),
            spans=sorted(self.spans, key=lambda s: (s[1], s[2])),
        )


def decide_for(r: _Replay) -> Holding:
    """The policy's workers for every active job (see the module)."""
    act = r.active()
    jobs = [tr.job for tr in act]
    now = {tr.job.name: tr.workers or (tr.target or []) for tr in act}
    holding = {n: names for n, names in now.items() if names}
    if r.policy == "fifo":
        return _fifo(r, act, holding)
    running = {tr.job.name: tr.workers for tr in act if tr.workers}
    left = {
        tr.job.name: (tr.job.steps - tr.done) / r.rate(tr)
        for tr in act
        if tr.workers and tr.ready_at is None
    }
    preempt = r.policy == "preempt"
    return decide(jobs, holding, running, left, r.workers, r.kinds, r.restart_s, preempt)


def _fifo(r: _Replay, act: list[Track], holding: Holding) -> Holding:
    """`fifo.fifo` over the active jobs, each asking for its arrival's `request`."""
    requests = {tr.job.name: tr.arrival.request for tr in act}
    return fifo([tr.job for tr in act], holding, r.workers, r.kinds, requests)


def replay(
    arrivals: list[Arrival],
    workers: dict[str, str],
    kinds: dict[str, Kind],
    policy: str,
    restart_s: float,
) -> Outcome:
    """Every job of `arrivals` run to its end on `workers` (name -> kind) under `policy`,
    each start and restart holding its workers idle for `restart_s`."""
    r = _Replay(arrivals, workers, kinds, policy, restart_s)
    while any(tr.finished_s is None for tr in r.tracks):
        r.step()
    return r.outcome()
