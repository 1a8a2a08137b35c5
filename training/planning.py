"""Turn a profile into a variant's plan: local batches and the gradient communication (pure)."""

from __future__ import annotations

from hetflow.config import ClusterSpec, ConfigError, TrainConfig
from hetflow.records import CompressionMethod, Plan, Profile
from hetflow.training.comm import auto_candidates, choose_compression
from hetflow.training.scheduler import balance_with_exclusion, equal_batches


def memory_caps(profile: Profile, cluster: ClusterSpec) -> list[int | None]:
    """Each worker's largest local batch: the one its profile measured (an out-of-memory
    search on CUDA, the resident-memory model on a CPU: `probes.memory`), or the one the user
    declared where that is lower. A declared cap above the measured one is a ConfigError naming
    the worker: the device does not hold it."""
    caps: list[int | None] = []
    for w, r in zip(cluster.workers, profile.ranks, strict=True):
        measured = r.memory_cap_batch  # None: not measured; 0: holds no sample
        if (
            w.memory_cap_batch is not None
            and measured is not None
            and w.memory_cap_batch > measured
        ):
            raise ConfigError(
                f"cluster.workers[{w.name}].memory_cap_batch: {w.memory_cap_batch} is more than "
                f"the {measured} samples {w.name}'s device holds (measured by the profile)"
            )
        caps.append(w.memory_cap_batch if w.memory_cap_batch is not None else measured)
    return caps


def make_plan(profile: Profile, cluster: ClusterSpec, train: TrainConfig) -> Plan:
    """Local batches from the profile's step models (`Profile.step_models`), the workers'
    memory caps (`memory_caps`) and the schedule, with the workers too slow to help left out
    (`scheduler.exclude_slow`; never under the equal split); the compression as
    `plan_compression` plans it ('auto': the candidates the workers try)."""
    speeds = [r.samples_per_s for r in profile.ranks]
    latency, per_sample = profile.step_models()
    caps = memory_caps(profile, cluster)
    excluded: list[str] = []
    if train.schedule == "equal":
        batches = equal_batches(cluster.world_size, train.global_batch)
    else:
        names = [w.name for w in cluster.workers]
        batches, excluded = balance_with_exclusion(
            per_sample, latency, train.global_batch, caps, names
        )
    method, reason, candidates = plan_compression(profile, cluster, train)
    return Plan(
        local_batches=batches,
        compression=method,
        compression_reason=reason,
        compression_candidates=candidates,
        speeds=speeds,
        latency_s=latency,
        per_sample_s=per_sample,
        caps=caps,
        excluded=excluded,
    )


def plan_compression(
    profile: Profile, cluster: ClusterSpec, train: TrainConfig
) -> tuple[CompressionMethod, str, list[CompressionMethod]]:
    """(method, why, candidates): the method the train config sets; for 'auto', 'none' and the
    candidates the workers try at the start of the run (`auto_candidates`, `training.trials`),
    or where nothing can be tried (one worker) the profile's rule (`choose_compression`)."""
    if train.compression != "auto":
        return train.compression_method(), "set in the train config", []
    candidates = auto_candidates(train, cluster)
    if not candidates:
        method, reason = choose_compression(profile.comm_share())
        return method, f"'auto' on one worker, from the profile: {reason}", []
    tried = ", ".join(str(m) for m in candidates)
    why = f"'auto': the workers try {tried} at the start of the run and keep the fastest"
    return CompressionMethod(), why, candidates


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
