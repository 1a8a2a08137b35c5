"""The rules across a job's models that JSON Schema cannot state (`check_job`): a global batch
smaller than the cluster, what `strategy: fsdp` and local SGD cannot run with, memory caps
that cannot hold the batch. Each raises `ConfigError` naming the field, before anything is
launched; `hetflow.config` re-exports them.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from hetflow.config.base import ConfigError
from hetflow.config.diloco import check_rounds

if TYPE_CHECKING:
    from hetflow.config.cluster import ClusterSpec
    from hetflow.config.train import TrainConfig


def fp16_fields(cluster: ClusterSpec, train: TrainConfig) -> list[str]:
    """Each worker's field that makes it compute in fp16 (its own, else the train config's)."""
    return [
        f"cluster.workers[{w.name}].precision" if w.precision else "train.precision"
        for w in cluster.workers
        if (w.precision or train.precision) == "fp16"
    ]


def check_job(cluster: ClusterSpec, train: TrainConfig) -> None:
    """Rules across models that JSON Schema cannot state; raises ConfigError before launch."""
    n = cluster.world_size
    if train.global_batch < n:
        raise ConfigError(
            f"train.global_batch: {train.global_batch} is smaller than the {n} workers of the "
            "cluster; every worker needs at least one sample per step"
        )
    if train.strategy == "fsdp":
        check_fsdp(cluster, train)
    check_on_loss(cluster, train)
    check_rounds(train, fp16_fields(cluster, train))
    local = train.local_sgd()  # (field, method name) where local SGD may run
    if train.nonfinite == "skip" and local is not None:
        raise ConfigError(
            f"train.nonfinite: 'skip' needs the gradient all-reduced every step, which "
            f"{local[1]} does not do ({local[0]}); use 'fail'"
        )
    if local is not None:
        fp16 = fp16_fields(cluster, train)
        if fp16:
            raise ConfigError(
                f"{fp16[0]}: fp16 scales the loss, and its skipped "
                f"steps must be the same on every rank, which {local[1]} (no all-reduce "
                f"every step; {local[0]}) cannot promise; use bf16 or fp32"
            )
    # 'auto' compression may be set per variant (the demo's optimized one): allow_local_sgd
    # alone is enough to refuse
    averaging = local or (("train.allow_local_sgd", "local SGD") if train.allow_local_sgd else None)
    if train.accumulate == "auto" and averaging is not None:
        raise ConfigError(
            f"train.accumulate: 'auto' accumulates micro-batches for one all-reduce per step, "
            f"which {averaging[1]} does not make ({averaging[0]}); use 'off'"
        )
    caps = [w.memory_cap_batch for w in cluster.workers]
    if (
        train.accumulate == "off"
        and all(c is not None for c in caps)
        and sum(caps) < train.global_batch
    ):
        raise ConfigError(
            f"cluster.workers.memory_cap_batch: the caps sum to {sum(caps)}, less than "
            f"train.global_batch={train.global_batch} (train.accumulate 'auto' runs the rest "
            "as micro-batches)"
        )


def check_fsdp(cluster: ClusterSpec, train: TrainConfig) -> None:
    """What `strategy: fsdp` cannot run with (`check_job`): a compression method or local SGD
    (both need DDP's comm hook or whole replicas) and fp16's loss scale (its Inf/NaN check
    would see each rank's own shard of the gradient, so the ranks could skip different
    steps). Micro-batches (`accumulate: auto`) run under it (`training.loop.sharded`)."""
    if train.compression != "none":
        raise ConfigError(
            f"train.compression: {train.compression!r} needs DDP's comm hook; strategy 'fsdp' "
            "reduce-scatters the plain gradient: use none"
        )
    if train.allow_local_sgd:
        raise ConfigError(
            "train.allow_local_sgd: local SGD averages whole replicas, and under strategy "
            "'fsdp' no worker holds one; leave it off"
        )
    fp16 = fp16_fields(cluster, train)
    if fp16:
        raise ConfigError(
            f"{fp16[0]}: fp16's loss scale checks each rank's shard of the gradient under "
            "strategy 'fsdp', and the ranks could skip different steps; use bf16 or fp32"
        )


# comm hooks that keep nothing between steps: a rank lost in place takes no hook state with it
STATELESS_HOOKS = ("none", "fp16", "bf16")


def check_on_loss(cluster: ClusterSpec, train: TrainConfig) -> None:
    """What `faults.on_loss: continue` (`training.elastic`) runs: the local launcher, strategy
    ddp, a comm hook that keeps no state between steps ('auto' may choose one that does); a
    late worker's rank and step within the cluster and the run; joins only under it."""
    faults = train.faults
    fields = (("join_at", faults.join_at), ("replace", faults.replace), ("spare", faults.spare))
    for field, on in fields:
        if on and faults.on_loss != "continue":
            raise ConfigError(
                f"train.faults.{field}: workers join in place under on_loss 'continue' only"
            )
    if train.faults.on_loss != "continue":
        return
    for rank, step in train.faults.join_at.items():
        if not 0 < rank < cluster.world_size:
            raise ConfigError(
                f"train.faults.join_at: rank {rank} is not a late worker of the cluster's "
                f"{cluster.world_size} (rank 0 starts the job)"
            )
        if not 0 < step < train.steps:
            raise ConfigError(
                f"train.faults.join_at: step {step} of rank {rank} is not in 1..{train.steps - 1}"
            )
    check_spare(cluster, faults.spare)
    where = "train.faults.on_loss: 'continue'"
    if cluster.launcher != "local":
        raise ConfigError(f"{where} runs on the local launcher only, not {cluster.launcher!r}")
    if train.strategy != "ddp":
        raise ConfigError(f"{where} needs strategy 'ddp', not {train.strategy!r}")
    if train.compression.split(":")[0] not in STATELESS_HOOKS:
        raise ConfigError(
            f"{where} needs compression none, fp16 or bf16, not {train.compression!r}"
        )


def check_spare(cluster: ClusterSpec, spare: list[str]) -> None:
    """`faults.spare` names workers of `cluster` and leaves at least one to start the job."""
    names = [w.name for w in cluster.workers]
    unknown = [n for n in spare if n not in names]
    if unknown:
        raise ConfigError(
            f"train.faults.spare: {unknown[0]!r} is not a worker of the cluster ({names})"
        )
    if spare and all(n in spare for n in names):
        raise ConfigError("train.faults.spare: every worker is spare; one must start the job")
