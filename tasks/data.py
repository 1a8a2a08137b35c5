"""Dataset tasks: ingest (idempotent, safe to kill) and verify."""

from __future__ import annotations

from prefect import task

from hetflow.config import DatasetSpec
from hetflow.infra.data.format import (
    DatasetError,
    Manifest,
    MissingDataset,
    check_shards,
    digits_source,
    read_existing,
    read_manifest,
    synthetic_source,
    verify_dataset,
    write_dataset,
)
from hetflow.infra.data.ingest import STREAMED_SOURCES, ingest_streamed
from hetflow.infra.paths import host_lock


def _write(spec: DatasetSpec) -> Manifest:
    """The source written to spec.url: in memory (digits, synthetic) or streamed."""
    if spec.source in STREAMED_SOURCES:
        return ingest_streamed(spec, ingest_params(spec))
    return write_dataset(spec.url, build_source(spec), spec.shard_samples, ingest_params(spec))


def build_source(spec: DatasetSpec) -> dict:
    if spec.source == "digits":
        return digits_source(spec.test_fraction, spec.seed)
    return synthetic_source(spec.synthetic_samples, spec.test_fraction, spec.seed)


def ingest_params(spec: DatasetSpec) -> dict:
    """What decides the dataset's content; recorded in the manifest, compared on reuse."""
    params = {
        "source": spec.source,
        "shard_samples": spec.shard_samples,
        "test_fraction": spec.test_fraction,
        "seed": spec.seed,
    }
    if spec.source == "synthetic":
        params["samples"] = spec.synthetic_samples
    if spec.source in STREAMED_SOURCES:
        fields = ("source_url", "glob", "columns", "label_column", "image_size", "max_mb")
        params.update(spec.model_dump(include=set(fields)))
    return params


def _retry_unless_bad_data(task, task_run, state) -> bool:
    """A DatasetError is deterministic (bad input, a mismatch): retrying cannot fix it."""
    try:
        exc = state.result(raise_on_failure=False)
    except Exception:
        return True
    return not isinstance(exc, DatasetError)


def _existing(spec: DatasetSpec) -> Manifest | None:
    """The dataset already at spec.url if it is there and is the one spec describes."""
    try:
        manifest = read_manifest(spec.url)
    except MissingDataset:
        return None  # nothing there, or a killed ingest's shards: (re)write
    except DatasetError as e:
        raise DatasetError(f"{e} (ingest with overwrite to replace it)") from None
    wanted = ingest_params(spec)
    for key, value in manifest.ingest.items():
        if key in wanted and wanted[key] != value:
            raise DatasetError(
                f"{spec.url}: already holds a dataset written with {key}={value!r}, not "
                f"{wanted[key]!r}; use another url, or ingest with overwrite to replace it"
            )
    check_shards(manifest)
    return manifest


@task(
    retries=2,
    retry_delay_seconds=[2, 10],
    retry_condition_fn=_retry_unless_bad_data,
    task_run_name="ingest {spec.source} -> {spec.url}",
)
def ingest_dataset(spec: DatasetSpec, overwrite: bool = False) -> Manifest:
    """Write the dataset as shards + manifest, unless the same dataset is already there.

    An existing dataset is reused only if its manifest is whole, was written with the same
    parameters and its shards are all there; anything else is an error naming the object
    (nothing a user wrote is replaced without `overwrite`).
    """
    # runs started at once on one dataset take turns: the second finds the first's dataset
    # instead of deleting its manifest to write the same shards again under a running job
    if spec.source == "existing":
        return read_existing(spec.url)
    with host_lock(f"dataset {spec.url}"):
        if not overwrite:
            manifest = _existing(spec)
            if manifest is not None:
                samples = manifest.splits["train"].samples
                print(f"dataset already at {spec.url}: {samples} train samples")
                return manifest
        manifest = _write(spec)
    splits = ", ".join(
        f"{k}: {v.samples} samples in {len(v.shards)} shards" for k, v in manifest.splits.items()
    )
    print(f"ingested {spec.source} to {spec.url} ({splits})")
    return manifest


@task(task_run_name="verify {url}")
def verify(url: str, deep: bool = False) -> Manifest:
    """The manifest, its shards listed (sizes), and with `deep` every SHA-256 checked."""
    manifest = read_manifest(url)
    verify_dataset(manifest, deep=deep)
    return manifest
