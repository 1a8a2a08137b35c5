"""Flow: profile, plan and train one variant on the cluster; record it in MLflow."""

from __future__ import annotations

from typing import Literal

from prefect import flow

from hetflow.config import (
    ClusterSpec,
    DatasetSpec,
    TrackingConfig,
    TrainConfig,
    check_job,
    default_cluster,
)
from hetflow.infra.s3 import local_s3_endpoint
from hetflow.tasks.data import ingest_dataset
from hetflow.tasks.profile import profile_workers, resolve_instance_types
from hetflow.tasks.train import train_variant


@flow(name="train", log_prints=True, retries=1, retry_delay_seconds=10)
def train(
    cluster: ClusterSpec = default_cluster(),
    dataset: DatasetSpec = DatasetSpec(),
    train: TrainConfig = TrainConfig(),
    tracking: TrackingConfig = TrackingConfig(),
    variant: Literal["baseline", "optimized"] = "optimized",
) -> dict:
    check_job(cluster, train)
    cfg = TrainConfig.variant(variant, **train.model_dump(exclude={"schedule", "compression"}))
    with local_s3_endpoint():
        cluster, catalog = resolve_instance_types(cluster)  # workers may name EC2 types
        epoch_samples = ingest_dataset(dataset).splits["train"].samples
        profile = profile_workers(cluster, dataset, cfg)
        outcome = train_variant(variant, cluster, dataset, cfg, profile, tracking,
                                catalog=catalog, epoch_samples=epoch_samples)
    return {"run_id": outcome.run_id, "metrics": outcome.metrics}
