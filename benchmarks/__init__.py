"""Benchmarks that compare variants in one invocation: `hetflow bench NAME`, `hetflow simulate`."""

from __future__ import annotations

import contextlib
import json
import tempfile
from collections.abc import Iterator
from pathlib import Path


def write_json(path: str | None, out: dict) -> None:
    """The benchmark's figures as JSON at `path` (its folder made), if a path was given."""
    if not path:
        return
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    Path(path).write_text(json.dumps(out, indent=1, default=str))
    print(f"wrote {path}")


def wide_console(min_width: int):
    """A rich console at least `min_width` wide: logs and pipes report 80 columns otherwise."""
    from rich.console import Console

    return Console(width=max(Console().width, min_width))


@contextlib.contextmanager
def digits_workspace(name: str, work_dir: str | None = None) -> Iterator[tuple[str, object]]:
    """(folder, DatasetSpec) for a benchmark: the digits in a bucket of a local S3 endpoint
    started for the benchmark (unless one is configured), cached under the folder, a temporary
    one unless `work_dir` is given."""
    from hetflow.config import DatasetSpec
    from hetflow.infra.datasets import digits_source, write_dataset
    from hetflow.infra.s3 import local_s3_endpoint

    folder = contextlib.nullcontext(work_dir) if work_dir else tempfile.TemporaryDirectory()
    with folder as tmp, local_s3_endpoint():
        dataset = DatasetSpec(url=f"s3://hetflow-bench/{name}", cache_dir=f"{tmp}/cache")
        write_dataset(dataset.url, digits_source(dataset.test_fraction, dataset.seed), dataset.shard_samples)
        yield tmp, dataset
