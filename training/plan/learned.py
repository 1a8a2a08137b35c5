"""What a training run's own steps measured of each worker, as a profile of it (pure).

A run that learns from its steps (`rebalancer`) ran each worker at one or more batches; the
mean compute time at each, fitted as a line (`fitting.robust_affine`, proportional where the
worker ran one batch), is what a profile's compute probe would have measured, and is stored in
the profile history as a profile's is (`learned_entries`, stored by
`tasks.history.store_learned`), so the next run starts from it. What the steps do not measure
stays unknown: the memory cap (a profile's search or model), the device's matmul and copy
rates, S3, and the all-reduce alone.
"""

from __future__ import annotations

import statistics
from collections import defaultdict

from hetflow.config import ClusterSpec, TrainConfig
from hetflow.history import TypeEntry, TypeKey, type_key
from hetflow.perf.fitting import robust_affine
from hetflow.records import RankProfile, RankResult, RunResult
from hetflow.training.plan.assemble import declared_link
from hetflow.training.plan.prior import line_rank

LEARNED_FROM = "measured by a training run's steps"
SKIP_AFTER_CHANGE = 2  # steps after each plan change left out (`loop.state.SETTLE_STEPS`)


def compute_points(result: RunResult, rank: int | RankResult) -> dict[int, float]:
    """A rank's mean compute time at each batch it ran in one pass (`rank`: its number among
    `result.ranks`, or any of `result.stretches` itself), leaving out step 0 and the first
    SKIP_AFTER_CHANGE steps of each plan (the one-off costs of a new batch size).

    >>> from hetflow.records import RankResult, StepRecord, PlanChange
    >>> recs = [StepRecord(step=s, batch=8 if s < 5 else 16, data_s=0, compute_s=0.1 if s < 5
    ...     else 0.15, wait_s=0, step_s=0, loss_sum=0, bytes_sent=0) for s in range(10)]
    >>> r = RankResult(rank=0, records=recs, plans=[PlanChange(step=0, plan=[8]),
    ...     PlanChange(step=5, plan=[16])])
    >>> compute_points(RunResult(ranks=[r]), 0)
    {8: 0.1, 16: 0.15}
    """
    ranks = {r.rank: r for r in result.ranks}
    lead = ranks[min(ranks)]
    starts = {p.step for p in lead.plans} | {0}
    fresh = {s + k for s in starts for k in range(SKIP_AFTER_CHANGE)}
    times: dict[int, list[float]] = defaultdict(list)
    own = rank if isinstance(rank, RankResult) else ranks[rank]
    for rec in own.records:
        if rec.batch > 0 and rec.step not in fresh and rec.micro_batches <= 1:
            times[rec.batch].append(rec.compute_s)
    return {b: statistics.median(ts) for b, ts in sorted(times.items())}


def learned_rank(rank: int, points: dict[int, float], reference_batch: int) -> RankProfile | None:
    """A `RankProfile` of the compute the run measured at `points` (batch -> seconds), its
    step at `reference_batch` from the fit; None without a point.

    >>> r = learned_rank(0, {8: 0.1, 16: 0.15, 32: 0.25}, 16)
    >>> round(r.fit_latency_s, 3), round(r.fit_s_per_sample, 5), r.compute_batches
    (0.05, 0.00625, [8, 16, 32])
    >>> learned_rank(0, {16: 0.2}, 16).fit_latency_s  # one batch: proportional
    0.0
    """
    if not points:
        return None
    batches, times = list(points), list(points.values())
    if len(batches) >= 2:
        a, c, _ = robust_affine(batches, times)
    else:
        a, c = 0.0, times[0] / batches[0]
    if c <= 0 or a < 0:  # noise bent the line: the pace at the largest batch, proportional
        a, c = 0.0, times[-1] / batches[-1]
    return line_rank(rank, a, c, reference_batch, compute_batches=batches, compute_best_s=times)


def learned_entries(
    cluster: ClusterSpec, train: TrainConfig, result: RunResult, stamp: str
) -> list[TypeEntry]:
    """One entry per worker type of `cluster` (the launched one) from what the run's steps
    measured (`compute_points`, `learned_rank`), measured at `stamp`: each process of the run
    (`RunResult.stretches`: the ranks at the end, then those that left in place, each with
    the steps it ran) counted as the worker it ran as (`RankResult.worker_index`), never by
    its position in the result, which a leave or a join in place shifts; of several of a
    type, the first. A worker that never computed has none; the link is the declared one
    (`assemble.declared_link`), the gradient's bytes its fp32 parameters'."""
    ref = max(1, train.global_batch // cluster.world_size)
    nodes = [r.node for r in result.ranks]
    entries: dict[TypeKey, TypeEntry] = {}
    for r in result.stretches:
        i = r.worker_index(cluster)
        key = type_key(cluster, i, train)
        learned = learned_rank(i, compute_points(result, r), ref)
        if key in entries or learned is None:
            continue
        gbps, latency, source = declared_link(cluster, i)
        rank = learned.model_copy(
            update={
                "worker": r.worker or cluster.workers[i].name,
                "node": r.node,
                "device": cluster.workers[i].device,
                "link_gbps": gbps,
                "link_latency_s": latency,
                "grad_bytes": 4 * r.params,
            }
        )
        entries[key] = TypeEntry(
            key=key,
            rank=rank,
            measured_at=stamp,
            link_source=f"{source}; {LEARNED_FROM}",
            cluster=cluster.name,
            world_size=cluster.world_size,
            host_ranks=max(1, nodes.count(r.node)),
        )
    return list(entries.values())
