"""Flow: write a dataset to S3 as shards plus a manifest, then check what was written."""

from __future__ import annotations

from prefect import flow

from hetflow.config import DatasetSpec
from hetflow.infra.s3 import local_s3_endpoint
from hetflow.tasks.data import ingest_dataset, verify
from hetflow.tasks.opening import reach_services


@flow(name="prepare-dataset", log_prints=True)
def prepare_dataset(
    dataset: DatasetSpec = DatasetSpec(), overwrite: bool = False, deep_verify: bool = False
) -> dict:
    """Ingest `dataset` (reused when the same one is already there) and verify its shards.

    `deep_verify` reads every shard back and checks its SHA-256 (costs one full read).
    """
    reach_services(dataset)
    with local_s3_endpoint(dataset.url):
        manifest = ingest_dataset(dataset, overwrite=overwrite)
        verify(dataset.url, deep=deep_verify)
    return manifest.model_dump()
