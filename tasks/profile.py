"""Profiling tasks: the catalog, a profile's storage and history in S3, its MLflow run.

A profile is stored as `<prefix>/<UTC timestamp>.json` (the names sort by time), where the
prefix defaults to `s3://<dataset bucket>/profiles/<cluster name>/<model>` (the local store's
default bucket for a dataset outside S3): profiles of one cluster and model form its history.
`speed_drift` (pure) compares a profile with the previous one and flags the workers whose
relative speed moved by more than a threshold.
"""

from __future__ import annotations

import datetime as dt
import math

from prefect import task

from hetflow.config import ClusterSpec, DatasetSpec, TrackingConfig, TrainConfig
from hetflow.history import TypeEntry
from hetflow.infra.catalog import Catalog, resolve_cluster
from hetflow.infra.paths import new_run_dir
from hetflow.infra.s3 import ensure_bucket, filesystem, profiles_root
from hetflow.infra.tracking.tracker import MLflowTracker
from hetflow.records import Profile, SpeedDrift
from hetflow.training.job import ResolvedJob
from hetflow.training.launch.run import measure_profile


def profiles_prefix(dataset: DatasetSpec, cluster: ClusterSpec, recipe: str) -> str:
    """Where a cluster's profiles of a recipe live: next to the dataset, in the same bucket;
    for a dataset outside S3, in the local store's default bucket (`infra.s3.profiles_root`);
    an import path's ':' as '.'."""
    return f"{profiles_root(dataset.url)}/{cluster.name}/{recipe.replace(':', '.')}"


def profile_stamp(now: dt.datetime | None = None) -> str:
    return (now or dt.datetime.now(dt.UTC)).strftime("%Y%m%dT%H%M%S%fZ")


@task(task_run_name="profile {cluster.name} ({cluster.world_size} workers)")
def profile_workers(
    cluster: ClusterSpec, dataset: DatasetSpec, train: TrainConfig, job: ResolvedJob | None = None
) -> Profile:
    """Measure every worker inside the cluster: fwd+bwd speed on the job's model, all-reduce;
    the placement of the flow's resolved `job` taken as it is (`ResolvedJob.placement_of`)."""
    placement = job.placement_of(cluster) if job else None
    profile = measure_profile(cluster, dataset, train, new_run_dir("profile"), placement=placement)
    speeds = ", ".join(f"{r.worker}={r.relative_speed:.2f}" for r in profile.ranks)
    print(
        f"profiled {cluster.world_size} workers in {profile.profiling_time_s:.1f}s; "
        f"relative speeds {speeds}"
    )
    return profile


@task(task_run_name="resolve instance types of {cluster.name}")
def resolve_instance_types(cluster: ClusterSpec) -> tuple[ClusterSpec, Catalog]:
    """Fill speeds and links of workers that name EC2 types (describe_instance_types)."""
    catalog = Catalog.for_cluster(cluster)
    resolved = resolve_cluster(cluster, catalog)
    if catalog.types:
        named = ", ".join(
            f"{w.name}={w.instance_type} (speed {w.speed:.2f}, link {w.link_gbps} Gbit/s)"
            for w in resolved.workers
        )
        print(f"instance types from the EC2 catalog: {named}")
    return resolved, catalog


@task(retries=2, retry_delay_seconds=[1, 5], task_run_name="store profile under {prefix}")
def store_profile(profile: Profile, prefix: str) -> str:
    """Write the profile as `<prefix>/<created_at>.json` (the Profile's JSON); returns its URL."""
    ensure_bucket(prefix)
    fs, root = filesystem(prefix)
    name = f"{profile.created_at}.json"
    fs.pipe_file(f"{root}/{name}", profile.model_dump_json(indent=1).encode())
    return f"{prefix}/{name}"


@task(retries=2, retry_delay_seconds=[1, 5], task_run_name="profile history under {prefix}")
def profile_history(prefix: str, limit: int = 20) -> list[Profile]:
    """The latest `limit` stored profiles under the prefix, oldest first; a file that is not a
    readable Profile is skipped."""
    fs, root = filesystem(prefix)
    try:
        names = sorted(p for p in fs.ls(root, detail=False) if p.endswith(".json"))
    except FileNotFoundError:
        return []
    out = []
    for path in names[-limit:]:
        try:
            out.append(Profile.model_validate_json(fs.cat_file(path)))
        except (OSError, ValueError):  # pydantic's ValidationError is a ValueError
            print(f"skipping unreadable profile {path}")
    return out


def speed_drift(previous: Profile | None, current: Profile, threshold: float) -> list[SpeedDrift]:
    """Workers whose relative speed moved by more than `threshold` (a fraction) since `previous`.

    Workers are matched by name; one that is new or gone (or had no speed) is not flagged.
    """
    if previous is None:
        return []
    before = {r.worker: r.relative_speed for r in previous.ranks}
    flagged = []
    for r in current.ranks:
        old, new = before.get(r.worker), r.relative_speed
        if not old:
            continue
        change = new / old - 1
        if abs(change) > threshold:
            flagged.append(
                SpeedDrift(
                    worker=r.worker,
                    previous_speed=old,
                    speed=new,
                    change=change,
                    previous_profile=previous.created_at,
                )
            )
    return flagged


RANK_METRICS = (
    "samples_per_s",
    "relative_speed",
    "link_gbps",
    "allreduce_latency_s",
    "matmul_gflops",
    "memory_gbps",
    "memory_per_sample_bytes",
    "memory_cap_batch",
    "s3_first_byte_s",
    "s3_read_mbps",
)


@task(retries=2, retry_delay_seconds=[2, 10], task_run_name="record profile in MLflow")
def record_profile(
    profile: Profile,
    cluster: ClusterSpec,
    dataset: DatasetSpec,
    tracking: TrackingConfig,
    entries: list[TypeEntry] = (),
) -> str:
    """One MLflow run (variant `profile`): per-rank figures as metrics, the JSON as an artifact,
    and a tag `history.<key slug>` per history entry written, its URL."""
    tracker = MLflowTracker(tracking)
    rid = tracker.start_run("profile", cluster, dataset)
    for e in entries:
        tracker.client.set_tag(rid, f"history.{e.key.slug()}", e.stored_at or "")
    metrics = {"profiling_time_s": float(profile.profiling_time_s)}
    for r in profile.ranks:
        for key in RANK_METRICS:
            value = getattr(r, key)
            if isinstance(value, (int, float)) and math.isfinite(value):
                metrics[f"rank{r.rank}/{key}"] = float(value)
    tracker.log_metrics(rid, metrics)
    tracker.log_json(rid, "profile.json", profile)
    tracker.finish(rid)
    return rid
