"""Turn a profile into a variant's plan: local batches and the gradient communication (pure)."""

from __future__ import annotations

from hetflow.config import ClusterSpec, TrainConfig
from hetflow.records import Plan
from hetflow.training.comm import choose_compression
from hetflow.training.scheduler import balance_batches, equal_batches, fitted_step_model


def comm_share(profile: dict) -> float:
    """Measured all-reduce time of one gradient over (compute + all-reduce) of one step."""
    ranks = profile["ranks"]
    comm = max(r["grad_allreduce_s"] for r in ranks)
    compute = max(r["step_compute_s"] for r in ranks)
    return comm / (comm + compute) if comm + compute > 0 else 0.0


def make_plan(profile: dict, cluster: ClusterSpec, train: TrainConfig) -> Plan:
    ranks = sorted(profile["ranks"], key=lambda r: r["rank"])
    speeds = [r["samples_per_s"] for r in ranks]
    latency, per_sample = fitted_step_model(ranks)
    caps = [w.memory_cap_batch for w in cluster.workers]
    if train.schedule == "equal":
        batches = equal_batches(cluster.world_size, train.global_batch)
    else:
        batches = balance_batches(per_sample, latency, train.global_batch, caps)
    if train.compression == "auto":
        method, reason = choose_compression(comm_share(profile))
    else:
        method, reason = train.compression_method(), "set in the train config"
    return Plan(local_batches=batches, compression=method, compression_reason=reason,
                speeds=speeds, latency_s=latency, per_sample_s=per_sample)


def ideal_throughput(latency: list[float], per_sample: list[float], global_batch: int) -> float:
    """Samples/s if every rank computed its balanced share with no wait and no communication."""
    lo, hi = 0.0, 1.0
    while sum(max(0.0, (hi - a) / c) for a, c in zip(latency, per_sample, strict=True)) < global_batch:
        hi *= 2
    for _ in range(100):
        mid = (lo + hi) / 2
        total = sum(max(0.0, (mid - a) / c) for a, c in zip(latency, per_sample, strict=True))
        lo, hi = (mid, hi) if total < global_batch else (lo, mid)
    return global_batch / hi
