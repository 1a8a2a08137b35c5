"""Turn a profile into a variant's plan: local batches and the gradient communication (pure)."""

from __future__ import annotations

from hetflow.config import ClusterSpec, TrainConfig
from hetflow.records import Plan, Profile
from hetflow.training.comm import choose_compression
from hetflow.training.scheduler import balance_batches, equal_batches


def make_plan(profile: Profile, cluster: ClusterSpec, train: TrainConfig) -> Plan:
    """Local batches from the profile's step models (`Profile.step_models`) and the schedule;
    the compression the train config sets, or for 'auto' the one the profile's communication
    share (`Profile.comm_share`) calls for."""
    speeds = [r.samples_per_s for r in profile.ranks]
    latency, per_sample = profile.step_models()
    caps = [w.memory_cap_batch for w in cluster.workers]
    if train.schedule == "equal":
        batches = equal_batches(cluster.world_size, train.global_batch)
    else:
        batches = balance_batches(per_sample, latency, train.global_batch, caps)
    if train.compression == "auto":
        method, reason = choose_compression(profile.comm_share())
    else:
        method, reason = train.compression_method(), "set in the train config"
    return Plan(
        local_batches=batches,
        compression=method,
        compression_reason=reason,
        speeds=speeds,
        latency_s=latency,
        per_sample_s=per_sample,
    )


def ideal_throughput(latency: list[float], per_sample: list[float], global_batch: int) -> float:
    """Samples/s if every rank computed its balanced share with no wait and no communication."""
    lo, hi = 0.0, 1.0
    while (
        sum(max(0.0, (hi - a) / c) for a, c in zip(latency, per_sample, strict=True)) < global_batch
    ):
        hi *= 2
    for _ in range(100):
        mid = (lo + hi) / 2
        total = sum(max(0.0, (mid - a) / c) for a, c in zip(latency, per_sample, strict=True))
        lo, hi = (mid, hi) if total < global_batch else (lo, mid)
    return global_batch / hi
