"""Flow: measure every worker of a cluster; the profile goes to Prefect and MLflow."""

from __future__ import annotations

from prefect import flow
from prefect.artifacts import create_table_artifact

from hetflow.config import ClusterSpec, DatasetSpec, TrackingConfig, TrainConfig, check_job, default_cluster
from infra.s3 import local_s3_endpoint
from tasks.cluster import profile_workers
from tasks.data import ingest_dataset


def profile_rows(profile: dict) -> list[dict]:
    return [
        {
            "worker": r["worker"],
            "relative_speed": round(r["relative_speed"], 3),
            "samples_per_s": round(r["samples_per_s"], 1),
            "allreduce_latency_ms": round(r["allreduce_latency_s"] * 1e3, 3),
            "allreduce_gbps": round(r["allreduce_gbps"], 3),
        }
        for r in profile["ranks"]
    ]


@flow(name="profile-cluster", log_prints=True)
def profile_cluster(
    cluster: ClusterSpec = default_cluster(),
    dataset: DatasetSpec = DatasetSpec(),
    train: TrainConfig = TrainConfig(),
    tracking: TrackingConfig = TrackingConfig(),
) -> dict:
    check_job(cluster, train)
    with local_s3_endpoint():
        ingest_dataset(dataset)
        profile = profile_workers(cluster, dataset, train)
    create_table_artifact(profile_rows(profile), key="profile", description=f"Profile of {cluster.name}")
    return profile
