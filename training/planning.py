"""Turn a profile into a variant's plan: local batches and the gradient communication (pure)."""

from __future__ import annotations

from pydantic import BaseModel

from hetflow.config import ClusterSpec, TrainConfig
from training.comm import choose_compression
from training.scheduler import equal_batches, plan_batches


class Plan(BaseModel):
    local_batches: list[int]
    compression: str
    compression_reason: str
    speeds: list[float]


def comm_share(profile: dict) -> float:
    """Measured all-reduce time of one gradient over (compute + all-reduce) of one step."""
    ranks = profile["ranks"]
    comm = max(r["grad_allreduce_s"] for r in ranks)
    compute = max(r["step_compute_s"] for r in ranks)
    return comm / (comm + compute) if comm + compute > 0 else 0.0


def make_plan(profile: dict, cluster: ClusterSpec, train: TrainConfig) -> Plan:
    speeds = [r["samples_per_s"] for r in sorted(profile["ranks"], key=lambda r: r["rank"])]
    caps = [w.memory_cap_batch for w in cluster.workers]
    if train.schedule == "equal":
        batches = equal_batches(cluster.world_size, train.global_batch)
    else:
        batches = plan_batches(speeds, train.global_batch, caps)
    if train.compression == "auto":
        method, reason = choose_compression(comm_share(profile))
    else:
        method, reason = train.compression, "set in the train config"
    return Plan(local_batches=batches, compression=method, compression_reason=reason, speeds=speeds)
