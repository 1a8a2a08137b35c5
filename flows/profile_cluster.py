"""Flow: measure every worker of a cluster; keep the profile and its history.

Each profile is stored as JSON under the cluster's profiles prefix in S3
(`s3://<dataset bucket>/profiles/<cluster>/<model>/<UTC timestamp>.json` unless
`profiles_url` says otherwise; the local store's default bucket for a dataset outside S3,
`infra.s3.profiles_root`), as an MLflow run's artifact (variant `profile`) and as a Prefect
table artifact. The previous profile under the prefix is read first: a worker whose relative
speed moved by more than `drift_threshold` since then is flagged (printed, in the table and in
the profile's `drift`). Workers that name EC2 instance types get their emulated speed and link
from the catalog before launch. Each type measured (instance type or preset, and what else makes
its figures: `hetflow.history.TypeKey`) also gets an entry in the profile history,
`s3://<dataset bucket>/profiles/types/<key slug>/<UTC timestamp>.json`, named by a tag
`history.<key slug>` of the MLflow run: later train, compare and demo runs reuse it
(`tasks.history.profile_or_reuse`). Deployed daily in prefect.yaml.
"""

from __future__ import annotations

from prefect import flow
from prefect.artifacts import create_table_artifact
from pydantic.json_schema import SkipJsonSchema

from hetflow.config import (
    ClusterSpec,
    ConfigError,
    DatasetSpec,
    TrackingConfig,
    TrainConfig,
    default_cluster,
)
from hetflow.flows.forms import Cluster, Dataset, Train
from hetflow.history import MEASURED_NOW
from hetflow.infra.catalog import cost_usd
from hetflow.records import Profile
from hetflow.tasks.history import store_profile_entries
from hetflow.tasks.opening import Reached, ResolvedJob, opened
from hetflow.tasks.profile import (
    profile_history,
    profile_stamp,
    profile_workers,
    profiles_prefix,
    record_profile,
    speed_drift,
    store_profile,
)


def profile_report(profile: Profile, cluster: ClusterSpec) -> dict:
    """Measured next to emulated, per worker; speeds relative to the fastest worker (= 1.0).

    `emulated_speed` and `link_gbps_emulated` are the cluster's settings (None when the cluster
    is not emulated; a None link is loopback), the link on the emulated clock (its bandwidth
    over the time scale, as the compute); every other figure is measured. `link_gbps_measured`
    and `link_latency_ms` are the fit of the worker's own point-to-point sends (latency +
    bytes / bandwidth); `memory_cap_batch` the largest local batch that fits its memory.
    """
    ranks = profile.ranks
    if len(ranks) != cluster.world_size:
        raise ValueError(
            f"profile has {len(ranks)} ranks, the cluster {cluster.world_size} workers"
        )
    fastest = max(r.samples_per_s for r in ranks)
    top = max(w.speed for w in cluster.workers)
    workers = []
    for r, w in zip(ranks, cluster.workers, strict=True):
        workers.append(
            {
                "name": w.name,
                "instance_type": w.instance_type,
                "emulated_speed": w.speed / top if cluster.emulate else None,
                "measured_speed": r.samples_per_s / fastest,
                "link_gbps_emulated": (
                    w.link_gbps / cluster.time_scale if cluster.emulate and w.link_gbps else None
                ),
                "link_gbps_measured": r.link_gbps,
                "link_latency_ms": (
                    r.link_latency_s if r.link_latency_s is not None else r.allreduce_latency_s
                )
                * 1e3,
                "memory_cap_batch": r.memory_cap_batch,
            }
        )
    return {
        "cluster": cluster.name,
        "workers": workers,
        "profiling_time_s": profile.profiling_time_s,
    }


def _fmt(value, spec: str, none: str = "-") -> str:
    return none if value is None else format(value, spec)


def print_profile_report(report: dict, console=None) -> None:
    """The report as a rich table: measured speed next to emulated, link, latency, memory cap."""
    from rich.console import Console
    from rich.table import Table

    console = console or Console()
    table = Table(
        title=f"profile of {report.get('cluster', 'cluster')} "
        "(speeds relative to the fastest worker)"
    )
    for name in (
        "worker",
        "speed emulated",
        "speed measured",
        "error",
        "link Gbit/s emulated",
        "link Gbit/s measured",
        "link error",
        "latency ms",
        "max local batch",
    ):
        table.add_column(name, justify="left" if name == "worker" else "right", overflow="fold")
    for w in report["workers"]:
        err = (w["measured_speed"] / w["emulated_speed"] - 1) if w["emulated_speed"] else None
        link_err = (
            w["link_gbps_measured"] / w["link_gbps_emulated"] - 1
            if w["link_gbps_emulated"] and w["link_gbps_measured"]
            else None
        )
        name = w["name"] + (f" ({w['instance_type']})" if w.get("instance_type") else "")
        table.add_row(
            name,
            _fmt(w["emulated_speed"], ".3f"),
            _fmt(w["measured_speed"], ".3f"),
            _fmt(err, "+.1%"),
            _fmt(w["link_gbps_emulated"], ".3g", "loopback"),
            _fmt(w["link_gbps_measured"], ".3g"),
            _fmt(link_err, "+.1%"),
            _fmt(w["link_latency_ms"], ".2f"),
            _fmt(w["memory_cap_batch"], ","),
        )
    console.print(table)
    if report.get("profiling_time_s") is not None:
        console.print(f"profiling took {report['profiling_time_s']:.1f}s (launch included)")


@flow(name="profile-cluster", log_prints=True)
def profile_cluster(
    cluster: Cluster = default_cluster(),
    dataset: Dataset = DatasetSpec(),
    train: Train = TrainConfig(),
    tracking: TrackingConfig = TrackingConfig(),
    profiles_url: str | SkipJsonSchema[None] = "",
    drift_threshold: float = 0.15,
    record: bool = True,
    job: SkipJsonSchema[ResolvedJob | None] = None,
    reached: SkipJsonSchema[Reached | None] = None,
) -> dict:
    """Profile the cluster; store the profile and flag workers whose speed drifted.

    Returns the Profile as JSON (`Profile.model_dump(mode="json")`) with its `report`
    (`profile_report`) beside the fields. `job` and `reached`: what the command that
    started the flow resolved and asked (`tasks.opening.opened`); none: the flow does both.
    """
    if not drift_threshold > 0:
        raise ConfigError(f"drift_threshold: must be > 0 (got {drift_threshold})")
    with opened(cluster, [train], dataset, tracking if record else None, job, reached) as run:
        cluster, catalog = run.cluster, run.catalog
        profile = profile_workers(cluster, dataset, run.job.resolved(train), run.job)
        profile.created_at = profile_stamp()
        profile.cluster_spec = cluster.model_dump(mode="json")
        report = profile_report(profile, cluster)
        if catalog.types:
            profile.cost = cost_usd(cluster, profile.profiling_time_s, catalog)
        prefix = (profiles_url or profiles_prefix(dataset, cluster, train.recipe)).rstrip("/")
        history = profile_history(prefix)
        profile.previous_profiles = [h.created_at for h in history]
        profile.drift = speed_drift(history[-1] if history else None, profile, drift_threshold)
        profile.stored_at = store_profile(profile, prefix)
        profile.sources = [MEASURED_NOW] * cluster.world_size
        entries = store_profile_entries(profile, cluster, dataset, train)
        if record:
            profile.mlflow_run_id = record_profile(profile, cluster, dataset, tracking, entries)
    _announce_drift(profile, report, cluster)
    return {**profile.model_dump(mode="json"), "report": report}


def _announce_drift(profile: Profile, report: dict, cluster: ClusterSpec) -> None:
    """Print each drifted worker; the report as a Prefect table with a `drifted` column."""
    for d in profile.drift:
        print(
            f"worker {d.worker}: relative speed {d.previous_speed:.2f} -> {d.speed:.2f} "
            f"({d.change:+.0%}) since profile {d.previous_profile}"
        )
    drifted = {d.worker for d in profile.drift}
    rows = [
        {
            **{k: (round(v, 3) if isinstance(v, float) else v) for k, v in w.items()},
            "drifted": w["name"] in drifted,
        }
        for w in report["workers"]
    ]
    create_table_artifact(
        rows, key="profile", description=f"Profile of {cluster.name} ({profile.stored_at})"
    )
