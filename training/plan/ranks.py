"""Which cluster worker each launched rank is (pure).

A plan covers every worker of the cluster; the workers it drops (`Plan.dropped`) are not
launched, so the launched ranks are the other workers renumbered in order. A run that goes on
without a lost node (`Recovery.left_out`) finishes on fewer still. `RankMap` is the one place
that knows this: it gives the launched cluster, plan and stragglers, and renames a run's
per-rank figures back to the cluster's workers.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TypeVar

from hetflow.config import ClusterSpec
from hetflow.emulation.device_model import Straggler
from hetflow.figures import RunMetrics, StepFigures
from hetflow.records import Plan, RunResult

M = TypeVar("M", RunMetrics, StepFigures)
Stragglers = list[Straggler]  # (rank, step, factor[, ramp])


@dataclass(frozen=True)
class RankMap:
    """The launched ranks of `plan` over `cluster`: every worker but `plan.dropped`, in order.

    >>> m = RankMap(ClusterSpec.from_speeds([1, 4, 2]), Plan(local_batches=[0, 48, 16],
    ...     dropped=["w0"]))
    >>> m.workers
    [1, 2]
    >>> from hetflow.figures import RankFigures
    >>> run = RunMetrics(ranks=[RankFigures(rank=0, local_batch=48, busy_fraction=0.9)])
    >>> [(r.rank, r.local_batch) for r in m.to_cluster(run).ranks]
    [(0, 0), (1, 48)]
    """

    cluster: ClusterSpec
    plan: Plan

    @property
    def workers(self) -> list[int]:
        """The cluster's index of each launched rank, in rank order."""
        return [i for i, w in enumerate(self.cluster.workers) if w.name not in self.plan.dropped]

    def launched(
        self, stragglers: Stragglers | None = None
    ) -> tuple[ClusterSpec, Plan, Stragglers]:
        """The cluster, plan and stragglers of the ranks launched, renumbered in order; each
        kept emulated worker keeps its own slowdown (the time scale follows the fastest worker
        launched)."""
        stragglers = list(stragglers or [])
        if not self.plan.dropped:
            return self.cluster, self.plan, stragglers
        keep = self.workers
        workers = self.cluster.workers
        fastest = max(w.speed for w in workers) / max(workers[i].speed for i in keep)
        sub = self.cluster.model_copy(
            update={
                "workers": [workers[i] for i in keep],
                "time_scale": self.cluster.time_scale * fastest,
            }
        )

        def pick(values: list) -> list:
            return [values[i] for i in keep] if values else []

        fields = ("local_batches", "speeds", "latency_s", "per_sample_s", "caps")
        sub_plan = self.plan.model_copy(update={f: pick(getattr(self.plan, f)) for f in fields})
        renumber = {old: new for new, old in enumerate(keep)}
        moved = [(renumber[r], *rest) for r, *rest in stragglers if r in renumber]
        return sub, sub_plan, moved

    def finished(self, result: RunResult) -> RankMap:
        """The map of the ranks `result` finished on: the workers the run went on without
        (`Recovery.left_out`, a lost node under Ray) dropped too."""
        left = [w for w in result.lead.recovery.left_out if w not in self.plan.dropped]
        if not left:
            return self
        plan = self.plan.model_copy(update={"dropped": [*self.plan.dropped, *left]})
        return RankMap(self.cluster, plan)

    def to_cluster(self, metrics: M) -> M:
        """`metrics` (a `RunMetrics` or a `StepFigures`) with each rank's figures renumbered
        from the launched ranks to the cluster's workers, so that a row of a comparison is one
        worker in every variant; a worker not launched gets local batch and busy fraction 0."""
        if not self.plan.dropped:
            return metrics
        keep = self.workers
        ranks = [r.model_copy(update={"rank": keep[r.rank]}) for r in metrics.ranks]
        kind = type(metrics.ranks[0]) if metrics.ranks else None
        for i, w in enumerate(self.cluster.workers):
            if w.name in self.plan.dropped and kind is not None:
                ranks.append(kind(rank=i, local_batch=0, busy_fraction=0.0))
        return metrics.model_copy(update={"ranks": sorted(ranks, key=lambda r: r.rank)})
