"""First come, first served, blind to the device type: the classic baseline the allocator is
measured against (pure).

Jobs are taken in arrival order; priority classes are ignored. Each job is given the first
`request` free workers, in the cluster's order, whose memory holds it (every worker that
holds it where it asks for none), and keeps them to its end: no preemption, no moves. A job
starts only when that many are free; the first job that cannot start blocks every job behind
it (no back-filling), so a later arrival never overtakes an earlier one. Worker speeds and a
job's step times are never read.

>>> from hetflow.queue.jobs import Job, Kind
>>> kinds = {"big": Kind("big", 80), "small": Kind("small", 16)}
>>> workers = {"b0": "big", "s0": "small", "s1": "small"}
>>> a, b, c = (Job(n, "normal", 32, 10, 8) for n in "abc")
>>> fifo([a, b, c], {"a": ["b0"]}, workers, kinds, {"a": 1, "b": 2, "c": 1})
{'a': ['b0'], 'b': ['s0', 's1']}
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from hetflow.queue.jobs import Job, Kind, fits

Holding = dict[str, list[str]]  # job name -> the workers it holds, in the cluster's order


def asks(job: Job, request: int | None, workers: Mapping[str, str], kinds) -> int:
    """How many workers `job` waits for: `request`, or every worker of the cluster that holds
    it where `request` is None; never more than hold it (a request larger than the cluster
    still runs)."""
    holds = sum(fits(job, kinds[kind]) for kind in workers.values())
    return holds if request is None else min(max(1, request), holds)


def fifo(
    jobs: Sequence[Job],
    holding: Mapping[str, Sequence[str]],
    workers: Mapping[str, str],
    kinds: Mapping[str, Kind],
    requests: Mapping[str, int | None] | None = None,
) -> Holding:
    """What each of `jobs` (the active ones, in arrival order) holds under FIFO: a job in
    `holding` (running, or bound for workers) keeps what it has; each other one, in order,
    the first `requests[name]` free workers that hold it (all of them where None or absent),
    until one cannot start: it and every job behind it wait (absent from the result)."""
    requests = requests or {}
    out: Holding = {n: list(names) for n, names in holding.items() if names}
    taken = {w for names in out.values() for w in names}
    for job in jobs:
        if job.name in out:
            continue
        want = asks(job, requests.get(job.name), workers, kinds)
        free = [w for w in workers if w not in taken and fits(job, kinds[workers[w]])]
        if want == 0 or len(free) < want:
            break
        out[job.name] = free[:want]
        taken |= set(free[:want])
    return out
