"""Dataset tasks."""

from __future__ import annotations

from prefect import task

from hetflow.config import DatasetSpec
from infra.datasets import DatasetError, Manifest, digits_source, read_manifest, synthetic_source, write_dataset


def build_source(spec: DatasetSpec) -> dict:
    if spec.source == "digits":
        return digits_source(spec.test_fraction, spec.seed)
    return synthetic_source(spec.synthetic_samples, spec.test_fraction, spec.seed)


@task(retries=2, retry_delay_seconds=[2, 10], task_run_name="ingest {spec.source} -> {spec.url}")
def ingest_dataset(spec: DatasetSpec, overwrite: bool = False) -> Manifest:
    """Write the dataset as shards + manifest, unless a manifest is already there."""
    if not overwrite:
        try:
            manifest = read_manifest(spec.url)
            print(f"dataset already at {spec.url}: {manifest.splits['train'].samples} train samples")
            return manifest
        except DatasetError:
            pass
    manifest = write_dataset(spec.url, build_source(spec), spec.shard_samples)
    splits = ", ".join(f"{k}: {v.samples} samples in {len(v.shards)} shards" for k, v in manifest.splits.items())
    print(f"ingested {spec.source} to {spec.url} ({splits})")
    return manifest
