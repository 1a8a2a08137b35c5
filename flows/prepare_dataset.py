"""Flow: write a dataset to S3 as shards plus a manifest."""

from __future__ import annotations

from prefect import flow

from hetflow.config import DatasetSpec
from infra.s3 import local_s3_endpoint
from tasks.data import ingest_dataset


@flow(name="prepare-dataset", log_prints=True)
def prepare_dataset(dataset: DatasetSpec = DatasetSpec(), overwrite: bool = False) -> dict:
    with local_s3_endpoint():
        manifest = ingest_dataset(dataset, overwrite=overwrite)
    return manifest.model_dump()
