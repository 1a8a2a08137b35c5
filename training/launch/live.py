"""The elastic jobs this process is running, by run directory (`live_job`): how the queue,
in another thread of the same process, reaches a running job's launcher to take a worker
from it, or give it one, in place (`training.elastic`, `faults.on_loss: continue`).

A registry of handles and not a file the launcher polls: the queue's segments are task runs
of its flow run, threads of this process, and a handle answers at once whether the worker's
process has ended (the queue gives the worker to another job only then).

The handle (`Members`, over the launcher's `elastic.launch.ElasticJob`: `Handle`):
`release(rank)` asks rank `rank` to leave at its next step boundary while the others go on
(a SIGTERM, which the rank's `elastic.departure.Departures` turns into a leave every rank
agrees on); `gone(rank)`, whether its process has ended; `add(worker)`, a worker started in
its free slot of the job, which joins at a step boundary (`ElasticJob.add_worker`);
`joined(rank)`, whether it is in; `rank_of(worker)`, the rank a worker runs as (the plan's
dropped workers run none: `plan.ranks.RankMap`; nor does one whose slot another worker holds
now).
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Protocol


class Members(Protocol):
    """A running elastic job's membership, as the queue moves it (see the module)."""

    def release(self, rank: int) -> None: ...

    def gone(self, rank: int) -> bool: ...

    def rank_of(self, worker: str) -> int | None: ...

    def add(self, worker: str) -> int: ...

    def joined(self, rank: int) -> bool: ...


class Handle:
    """`Members` over a running `elastic.launch.ElasticJob` (its `release`; its processes by
    rank, `procs`, and the worker each runs as, `holders`, under its `lock`; its launched
    cluster, `spec.cluster`)."""

    def __init__(self, job) -> None:
        self.job = job
        self.names = [w.name for w in job.spec.cluster.workers]

    def release(self, rank: int) -> None:
        """Rank `rank` leaves at its next step boundary, the others regroup."""
        self.job.release(rank)

    def gone(self, rank: int) -> bool:
        with self.job.lock:
            p = self.job.procs.get(rank)
        return p is None or p.poll() is not None

    def add(self, worker: str) -> int:
        """`worker` (a worker of the launched cluster) started in its free slot: it joins
        the running job at a step boundary. Its rank; ValueError where its slot is not free."""
        spec = next((w for w in self.job.spec.cluster.workers if w.name == worker), None)
        if spec is None:
            raise ValueError(f"{worker!r} is not a worker of the job's cluster")
        return self.job.add_worker(spec)

    def joined(self, rank: int) -> bool:
        """Whether rank `rank`'s worker, started to join, is in a generation of the job."""
        with self.job.lock:
            p = self.job.procs.get(rank)
            asking = rank in self.job.joining
        return p is not None and p.poll() is None and not asking

    def rank_of(self, worker: str) -> int | None:
        """The slot whose newest process runs as `worker` (one added in place included), else
        `worker`'s own slot in the launch where no process was started in it yet (a late
        one); None where another worker holds that slot, or `worker` is not of the job."""
        with self.job.lock:
            held = dict(getattr(self.job, "holders", {}))
        for r, name in held.items():
            if name == worker:
                return r
        own = self.names.index(worker) if worker in self.names else None
        return own if own not in held else None


_LIVE: dict[str, Members] = {}
_LOCK = threading.Lock()


@contextlib.contextmanager
def registered(run_dir: str | Path, members: Members) -> Iterator[Members]:
    """`members` findable by `run_dir` while the block runs."""
    key = str(Path(run_dir).resolve())
    with _LOCK:
        _LIVE[key] = members
    try:
        yield members
    finally:
        with _LOCK:
            if _LIVE.get(key) is members:
                del _LIVE[key]


def live_job(run_dir: str | Path) -> Members | None:
    """The running elastic job of `run_dir` in this process, or None (none runs there, or it
    is not elastic)."""
    with _LOCK:
        return _LIVE.get(str(Path(run_dir).resolve()))
