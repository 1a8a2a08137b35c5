"""Whether to move workers between jobs: only when the move gains more than it costs.

Both sides are in the allocator's unit, weighted normalised throughput x seconds
(`allocate.objective`). The gain is the objective's rise from `keep` (running jobs keep their
workers, the free ones are shared) to `move` (the allocation over everything), over the
`horizon_s` it lasts. The cost is the switch: every running job whose workers change stops at
its next checkpoint (no step is lost) and restarts on its new workers, idle for `switch_s`
(launch, checkpoint load, warm-up), so it loses its new normalised throughput x `switch_s`;
one moved to no worker restarts later, on workers not known yet, and is charged that
restart now at the throughput it has (left out, a stop would look free beside a relaunch).
A job that moves in place (`InPlace`: it runs elastic) does not stop: where it keeps some of its
workers, those it gives up leave, and those it takes join, at a step boundary, its members
pausing for a regroup, `InPlace.cost_s`, measured; where it keeps none (`across`), it takes
its new workers first and lets its old ones go once they have joined, two regroups.
Where the seconds until each running job's checkpoint are known (`InPlace.until_stop_s`), a
move that relaunches a job changes nothing until that checkpoint: its gain runs over the
horizon less that wait (`net`); a move in place waits its own seconds only.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from hetflow.queue.allocate import Holding, allocate, normalised, objective, usable
from hetflow.queue.jobs import Job


def moved(running: Mapping[str, Sequence[str]], move: Mapping[str, Sequence[str]]) -> list[str]:
    """The running jobs (holding workers now) whose workers `move` changes."""
    return [
        name
        for name, names in running.items()
        if names and sorted(names) != sorted(move.get(name, ()))
    ]


@dataclass(frozen=True)
class InPlace:
    """The running jobs that move in place (`jobs`: elastic, `QueueJob.in_place`: launched
    with a spare slot for every worker they could take) and the seconds such a move costs
    them (`cost_s`: from the request to the job stepping again on its new workers). A move
    in place keeps some of the job's workers, gives others up, takes others or both; one
    that keeps none grows onto its new workers, then lets its old ones go (`across`): two
    regroups, where it can; else it relaunches: `switch_s`.

    >>> moving = InPlace(frozenset({"a", "b"}), 0.5)
    >>> moving.costs({"a": ["w0", "w1"]}, {"a": ["w0"]}, switch_s=15)
    {'a': 0.5}
    >>> moving.costs({"a": ["w0"]}, {"a": ["w1"]}, switch_s=15)
    {'a': 1.0}
    >>> moving.costs({"a": ["w0"], "b": ["w1"]}, {"a": ["w1"], "b": ["w0"]}, switch_s=15)
    {'a': 15, 'b': 15}
    """

    jobs: frozenset[str] = frozenset()
    cost_s: float = 0.0
    until_stop_s: Mapping[str, float] = field(default_factory=dict)  # running job -> s

    def in_place(self, running: Holding, move: Holding) -> dict[str, float]:
        """Each running job `move` changes in place and the seconds that costs it: one
        regroup where it keeps some of its workers, two where it moves wholly (`across`)."""
        over = across(running, move, self.jobs)
        return {
            n: 2 * self.cost_s if n in over else self.cost_s
            for n in moved(running, move)
            if n in over or (n in self.jobs and set(move.get(n, ())) & set(running[n]))
        }

    def costs(self, running: Holding, move: Holding, switch_s: float) -> dict[str, float]:
        """Each running job `move` changes (`moved`) and the seconds its switch costs it:
        `in_place`'s, else a relaunch's `switch_s`."""
        kept = self.in_place(running, move)
        return {n: kept.get(n, switch_s) for n in moved(running, move)}

    def relaunched(self, running: Holding, move: Holding) -> list[str]:
        """The running jobs `move` changes that it relaunches (none of them in place)."""
        kept = self.in_place(running, move)
        return [n for n in moved(running, move) if n not in kept]


def across(running: Holding, move: Holding, elastic: Iterable[str]) -> frozenset[str]:
    """The running jobs of `elastic` that `move` sends wholly to other workers and that can
    move so in place: each grows onto its new workers once they are free, then lets its old
    ones go. Not one whose new workers another such job holds that waits in turn, through
    others or not, for its workers (a cycle: each would need the other's worker before it
    gives its own up): those relaunch.

    >>> across({"a": ["w0"], "b": ["w1"]}, {"a": ["w1"], "b": ["w2"]}, {"a", "b"})
    frozenset({'a', 'b'})
    >>> sorted(across({"a": ["w0"], "b": ["w1"]}, {"a": ["w1"], "b": ["w0"]}, {"a", "b"}))
    []
    """
    whole = {
        n for n in elastic if running.get(n) and move.get(n) and not set(move[n]) & set(running[n])
    }
    waits = {n: {m for m in whole if m != n and set(move[n]) & set(running[m])} for n in whole}

    def cyclic(n: str) -> bool:
        seen, todo = set(), list(waits[n])
        while todo:
            m = todo.pop()
            if m == n:
                return True
            if m not in seen:
                seen.add(m)
                todo += waits[m]
        return False

    return frozenset(n for n in whole if not cyclic(n))


def switch_cost(
    jobs: Sequence[Job],
    running: Holding,
    move: Holding,
    workers,
    kinds,
    switch_s: float,
    in_place: InPlace | None = None,
) -> float:
    """What the moved jobs lose while they restart (one moved to no worker, at its
    throughput now), or regroup in place (see the module)."""
    by_name = {j.name: j for j in jobs}
    in_place = in_place or InPlace()
    return sum(
        by_name[n].weight * normalised(by_name[n], move.get(n) or running[n], workers, kinds) * s
        for n, s in in_place.costs(running, move, switch_s).items()
        if n in by_name
    )


def net(
    jobs: Sequence[Job],
    running: Holding,
    keep: Holding,
    move: Holding,
    workers,
    kinds,
    switch_s: float,
    horizon_s: float,
    in_place: InPlace | None = None,
) -> float:
    """What `move` is worth over `keep` in `horizon_s`, less its switches: its objective's
    rise over the horizon less the wait for the slowest switch (nothing changes before
    that): a relaunched job's checkpoint (`InPlace.until_stop_s`), a move in place's own
    seconds; less `switch_cost`."""
    in_place = in_place or InPlace()
    stops = [in_place.until_stop_s.get(n, 0.0) for n in in_place.relaunched(running, move)]
    wait = max([*stops, *in_place.in_place(running, move).values()], default=0.0)
    rise = objective(jobs, move, workers, kinds) - objective(jobs, keep, workers, kinds)
    cost = switch_cost(jobs, running, move, workers, kinds, switch_s, in_place)
    return rise * max(0.0, horizon_s - wait) - cost


def choose(
    jobs: Sequence[Job],
    running: Holding,
    keep: Holding,
    move: Holding,
    workers,
    kinds,
    switch_s: float,
    horizon_s: float,
    in_place: InPlace | None = None,
) -> Holding:
    """`move` if its gain over `keep` in `horizon_s` beats the cost of its switches, else
    `keep`; `keep` when both hold the running jobs alike.

    >>> from hetflow.queue.jobs import Job, Kind, Line
    >>> kinds = {"k": Kind("k", 16)}
    >>> workers = {"w0": "k", "w1": "k"}
    >>> a = Job("a", "low", 8, 10, 1, {"k": Line(0.1, 0.01)})
    >>> b = Job("b", "high", 8, 10, 1, {"k": Line(0.1, 0.01)})
    >>> running, keep = {"a": ["w0", "w1"]}, {"a": ["w0", "w1"], "b": []}
    >>> move = {"a": ["w0"], "b": ["w1"]}
    >>> choose([a, b], running, keep, move, workers, kinds, switch_s=5, horizon_s=60) == move
    True
    >>> choose([a, b], running, keep, move, workers, kinds, switch_s=5, horizon_s=0.5) == keep
    True
    """
    if not moved(running, move):
        return move
    worth = net(jobs, running, keep, move, workers, kinds, switch_s, horizon_s, in_place)
    return move if worth > 0 else keep


def decide(
    jobs: Sequence[Job],
    holding: Holding,
    running: Holding,
    left_s: Mapping[str, float],
    workers,
    kinds,
    switch_s: float,
    preempt: bool = True,
    in_place: InPlace | None = None,
) -> Holding:
    """The workers every job of `jobs` (in arrival order) should hold, from what each holds
    or is bound for (`holding`) and what the running ones hold (`running`), `left_s` being
    each running job's time to its end where it is.

    Without `preempt`, jobs keep what they hold and the free workers are shared. With it,
    the allocation over everything (a running job of the highest class kept as it is, since
    nothing outranks it) where `choose` finds it worth its switches over the time the
    soonest-ending running job has left, each move priced as `InPlace.cost` says; and where
    some running jobs move in place (`in_place`), the allocation that keeps each of them on
    at least one of its own workers (`kept_in_place`), where it is worth more, its switches
    counted, over that time.
    """
    keep = allocate(jobs, workers, kinds, fixed=holding)
    if not preempt:
        return keep
    top = {j.name: running[j.name] for j in jobs if j.rank == 0 and running.get(j.name)}
    move = allocate(jobs, workers, kinds, fixed=top, held=holding)
    horizon = min(left_s.values(), default=float("inf"))
    best = choose(jobs, running, keep, move, workers, kinds, switch_s, horizon, in_place)
    names = in_place.jobs if in_place else ()
    elastic = {n: running[n] for n in names if running.get(n) and n not in top}
    if not elastic:
        return best

    def worth(x: Holding) -> float:
        return net(jobs, running, keep, x, workers, kinds, switch_s, horizon, in_place)

    def build(kept: Holding) -> Holding:
        return allocate(jobs, workers, kinds, fixed=top, held=holding, kept=kept)

    def worth_kept(x: Holding) -> float:  # never a job waiting while a lower one holds
        return -math.inf if outranked(jobs, x, workers, kinds) else worth(x)

    shrink = kept_in_place(elastic, workers, build, worth_kept)
    return shrink if worth_kept(shrink) > worth(best) else best


def outranked(jobs: Sequence[Job], x: Holding, workers, kinds) -> bool:
    """Whether in `x` a job without workers could hold one that a job of a lower class
    holds (what the allocator never does, `allocate`)."""
    held = {j.name: x.get(j.name, ()) for j in jobs}
    return any(
        usable(j, kinds[workers[w]])
        for j in jobs
        if not held[j.name]
        for o in jobs
        if o.rank > j.rank
        for w in held[o.name]
    )


def kept_in_place(elastic: Holding, workers: Mapping[str, str], build, worth) -> Holding:
    """The allocation (`build`, from the workers each job keeps) that keeps each running
    elastic job of `elastic` on one of its own workers, so moves them all in place, worth most
    by `worth`. Which one each keeps is searched job by job, each trying one worker of every
    kind it holds, the others' as chosen so far: one pass, linear in the jobs, not over every
    combination. Without it the allocation over everything hands the workers a running job
    holds to the arrivals first, by class, and can leave it none of its own: a stop at its
    checkpoint and a relaunch where giving up some of them in place would do."""
    choice = {n: names[0] for n, names in elastic.items()}
    made: dict[tuple, tuple[float, Holding]] = {}

    def trial(n: str, w: str) -> tuple[float, Holding]:
        kept = {m: [w if m == n else choice[m]] for m in elastic}
        key = tuple(sorted((m, k[0]) for m, k in kept.items()))
        if key not in made:
            x = build(kept)
            made[key] = (worth(x), x)
        return made[key]

    for n, names in elastic.items():
        firsts = {workers[w]: w for w in reversed(names)}  # the first worker of each kind
        choice[n] = max(firsts.values(), key=lambda w, n=n: trial(n, w)[0])
    return trial(n, choice[n])[1]
