"""A throwaway dataset in S3 (digits, or the standard library's source as tokens), for
commands that train small runs of their own (`hetflow simulate --calibrate`, the benchmarks)."""

from __future__ import annotations

import contextlib
import tempfile
from collections.abc import Iterator

from hetflow.config import DatasetSpec
from hetflow.infra.data.format import digits_source, write_dataset
from hetflow.infra.data.ingest import ingest_streamed
from hetflow.infra.s3 import local_s3_endpoint


@contextlib.contextmanager
def digits_workspace(
    name: str, work_dir: str | None = None, text_mb: float | None = None
) -> Iterator[tuple[str, DatasetSpec]]:
    """(folder, DatasetSpec): the digits (or, with `text_mb`, that many MB of the standard
    library's source as byte tokens) written to `s3://hetflow-bench/NAME` on a local S3
    endpoint started for the block and not kept in the local store (unless one is configured),
    cached under the folder, a temporary one unless `work_dir` is given."""
    folder = contextlib.nullcontext(work_dir) if work_dir else tempfile.TemporaryDirectory()
    with folder as tmp, local_s3_endpoint(keep=False):
        url, cache = f"s3://hetflow-bench/{name}", f"{tmp}/cache"
        if text_mb:
            dataset = DatasetSpec(source="stdlib", url=url, cache_dir=cache, max_mb=text_mb)
            ingest_streamed(dataset, {"source": "stdlib", "max_mb": text_mb})
        else:
            dataset = DatasetSpec(url=url, cache_dir=cache)
            source = digits_source(dataset.test_fraction, dataset.seed)
            write_dataset(dataset.url, source, dataset.shard_samples)
        yield tmp, dataset
