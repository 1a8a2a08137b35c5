"""Helpers both halves of test_datasets.py use: tests/unit/infra/test_datasets.py and
tests/integration/infra/test_datasets.py (and any other test module that imports them)."""

from __future__ import annotations

from hetflow.config import DatasetSpec


def _spec(tmp_path, url="s3://hetflow-test-ds/syn", **kw) -> DatasetSpec:
    kw = {"source": "synthetic", "synthetic_samples": 100, "shard_samples": 32, **kw}
    return DatasetSpec(url=url, cache_dir=str(tmp_path / "cache"), **kw)
