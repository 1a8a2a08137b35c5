"""What the queue knows of a job and of the cluster's workers, and what it refuses.

A job's speed on a worker kind is its step-time line there, `a + c x batch` (the profile
history's fit of one worker of that kind: `TypeEntry.rank`); a kind the history lacks is
measured on one worker of it before the job is placed (`unmeasured`). A job's memory need is
what one worker must hold at the least (parameters, gradients, optimizer state and one
micro-batch); a kind with less memory never holds the job.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from hetflow.perf import curve as perf_curve
from hetflow.perf.collective import RING_ALPHA_S, ring_allreduce_time

# Priority classes, highest first, with the weight each job of the class has in the
# allocator's objective.
PRIORITIES: dict[str, float] = {"high": 4.0, "normal": 1.0, "low": 0.5}


class QueueError(ValueError):
    """Bad input to the queue: one line naming the field."""


@dataclass(frozen=True)
class Kind:
    """A worker kind of the cluster: the memory of one worker and its link (bandwidth, and
    latency per hop of a ring)."""

    name: str
    memory_gb: float
    link_gbps: float = 10.0
    link_latency_s: float = RING_ALPHA_S


@dataclass(frozen=True)
class Line:
    """A step-time line on one worker: `fixed_s + per_sample_s x batch` seconds."""

    fixed_s: float
    per_sample_s: float

    @property
    def curve(self) -> perf_curve.Line:
        """The line as the performance model's curve."""
        return perf_curve.Line(self.fixed_s, self.per_sample_s)


@dataclass(frozen=True)
class Job:
    """A job as the allocator sees it: its priority class, global batch, steps, per-worker
    memory need, gradient size (what each step all-reduces) and step-time line per kind."""

    name: str
    priority: str
    global_batch: int
    steps: int
    memory_gb: float
    lines: dict[str, Line] = field(default_factory=dict)
    grad_mb: float = 0.0
    checkpoint_every: int = 25

    @property
    def weight(self) -> float:
        return PRIORITIES[self.priority]

    @property
    def rank(self) -> int:
        """0 for the highest class."""
        return list(PRIORITIES).index(self.priority)


def check_priority(priority: str) -> str:
    """`priority` if it is a class, else a QueueError naming the field and the classes."""
    if priority not in PRIORITIES:
        raise QueueError(f"priority: unknown class {priority!r}; one of {', '.join(PRIORITIES)}")
    return priority


def fits(job: Job, kind: Kind) -> bool:
    """Whether one worker of `kind` holds `job`."""
    return job.memory_gb <= kind.memory_gb


def check_job(job: Job, kinds: dict[str, Kind]) -> Job:
    """`job` if the queue can take it: a known priority class and at least one kind of the
    cluster that holds it; else a QueueError in one line.
    """
    check_priority(job.priority)
    if job.global_batch < 1 or job.steps < 1 or job.checkpoint_every < 1:
        raise QueueError(f"job {job.name!r}: global_batch, steps and checkpoint_every >= 1")
    if not any(fits(job, k) for k in kinds.values()):
        most = max((k.memory_gb for k in kinds.values()), default=0)
        raise QueueError(
            f"memory_gb: job {job.name!r} needs {job.memory_gb:g} GB a worker; the largest "
            f"worker of the cluster has {most:g} GB"
        )
    return job


def unmeasured(job: Job, kinds: dict[str, Kind]) -> list[str]:
    """The kinds that hold `job` but have no step-time line for it: each is measured on one
    worker of that kind before the job is placed."""
    return [k for k, kind in kinds.items() if fits(job, kind) and k not in job.lines]


def allreduce_s(job: Job, kinds: list[Kind]) -> float:
    """The ring all-reduce of the job's gradient over workers of `kinds` (one entry a
    worker), the performance model's: 2(n-1) hops of the slowest link's latency and
    2(n-1)/n x bytes over the narrowest link; 0 on one worker, or for a job whose gradient
    is not known (`grad_mb` 0)."""
    n = len(kinds)
    if n < 2 or job.grad_mb <= 0:
        return 0.0
    gbps = min(k.link_gbps for k in kinds)
    alpha = max(k.link_latency_s for k in kinds)
    return ring_allreduce_time(job.grad_mb * 1e6, n, alpha, gbps)
