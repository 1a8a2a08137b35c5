"""A throwaway digits dataset in S3, for commands that train small runs of their own
(`hetflow simulate --calibrate`, the benchmarks)."""

from __future__ import annotations

import contextlib
import tempfile
from collections.abc import Iterator

from hetflow.config import DatasetSpec
from hetflow.infra.datasets import digits_source, write_dataset
from hetflow.infra.s3 import local_s3_endpoint


@contextlib.contextmanager
def digits_workspace(name: str, work_dir: str | None = None) -> Iterator[tuple[str, DatasetSpec]]:
    """(folder, DatasetSpec): the digits written to `s3://hetflow-bench/NAME` on a local S3
    endpoint started for the block (unless one is configured), cached under the folder, a
    temporary one unless `work_dir` is given."""
    folder = contextlib.nullcontext(work_dir) if work_dir else tempfile.TemporaryDirectory()
    with folder as tmp, local_s3_endpoint():
        dataset = DatasetSpec(url=f"s3://hetflow-bench/{name}", cache_dir=f"{tmp}/cache")
        source = digits_source(dataset.test_fraction, dataset.seed)
        write_dataset(dataset.url, source, dataset.shard_samples)
        yield tmp, dataset
