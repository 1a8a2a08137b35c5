"""Which cluster worker each launched rank is (pure).

A plan covers every worker of the cluster; the workers it drops (`Plan.dropped`) are not
launched, so the launched ranks are the other workers renumbered in order. A run that goes on
without a lost node (`Recovery.left_out`) finishes on fewer still. `RankMap` is the one place
that knows this: it gives the launched cluster, plan and stragglers, and renames a run's
per-rank figures (`rank{r}/NAME`) back to the cluster's workers.
"""

from __future__ import annotations

from dataclasses import dataclass

from hetflow.config import ClusterSpec
from hetflow.records import Plan, RunResult

Stragglers = list[tuple[int, int, float]]  # (rank, step, factor)


def rank_key(rank: int, name: str) -> str:
    """The name of rank `rank`'s figure `name`, as MLflow shows it: `rank{rank}/{name}`."""
    return f"rank{rank}/{name}"


def split_rank_key(key: str) -> tuple[int, str] | None:
    """(rank, name) of a `rank{r}/NAME` figure; None for a figure of the whole run.

    >>> split_rank_key("rank3/local_batch"), split_rank_key("loss")
    ((3, 'local_batch'), None)
    """
    head, sep, rest = key.partition("/")
    if sep and head.startswith("rank") and head[4:].isdigit():
        return int(head[4:]), rest
    return None


@dataclass(frozen=True)
class RankMap:
    """The launched ranks of `plan` over `cluster`: every worker but `plan.dropped`, in order.

    >>> m = RankMap(ClusterSpec.from_speeds([1, 4, 2]), Plan(local_batches=[0, 48, 16],
    ...     dropped=["w0"]))
    >>> m.workers
    [1, 2]
    >>> m.to_cluster({"rank0/local_batch": 48, "loss": 1.0})  # doctest: +NORMALIZE_WHITESPACE
    {'rank1/local_batch': 48, 'loss': 1.0, 'rank0/local_batch': 0,
     'rank0/busy_fraction': 0.0}
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
        moved = [(renumber[r], s, f) for r, s, f in stragglers if r in renumber]
        return sub, sub_plan, moved

    def finished(self, result: RunResult) -> RankMap:
        """The map of the ranks `result` finished on: the workers the run went on without
        (`Recovery.left_out`, a lost node under Ray) dropped too."""
        left = [w for w in result.lead.recovery.left_out if w not in self.plan.dropped]
        if not left:
            return self
        plan = self.plan.model_copy(update={"dropped": [*self.plan.dropped, *left]})
        return RankMap(self.cluster, plan)

    def to_cluster(self, figures: dict) -> dict:
        """`figures` with each `rank{r}/` name renumbered from the launched ranks to the
        cluster's workers, so that a row of a comparison is one worker in every variant; a
        dropped worker gets local_batch and busy_fraction 0."""
        if not self.plan.dropped:
            return figures
        keep = self.workers
        out = {}
        for key, value in figures.items():
            parsed = split_rank_key(key)
            out[rank_key(keep[parsed[0]], parsed[1]) if parsed else key] = value
        for i, w in enumerate(self.cluster.workers):
            if w.name in self.plan.dropped:
                out |= {rank_key(i, "local_batch"): 0, rank_key(i, "busy_fraction"): 0.0}
        return out
