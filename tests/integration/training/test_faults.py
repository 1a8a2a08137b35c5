"""Fault injection: transient S3 faults are absorbed by botocore/s3fs retries, permanent ones
fail fast naming the object. Each test adds a row to the table printed after the run."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from hetflow.infra.data.cache import ShardCache
from hetflow.infra.data.format import (
    DatasetError,
    decode_shard,
    digits_source,
    read_manifest,
    write_dataset,
)
from hetflow.training.loop.checkpoint_store import CheckpointStore

from tests.faults import FaultProxy

FAULTS = [("503", 4), ("500", 5), ("reset", 6)]


@pytest.fixture
def via_proxy(s3, monkeypatch):
    def start(fault: str, every: int) -> FaultProxy:
        proxy = FaultProxy(s3, fault, every)
        monkeypatch.setenv("AWS_ENDPOINT_URL", proxy.url)
        return proxy

    return start


def _same_dataset(url: str) -> bool:
    """Everything the manifest lists reads back with its checksum: nothing lost or damaged."""
    return read_manifest(url).splits["train"].samples == 1437


@pytest.mark.parametrize("fault, every", FAULTS, ids=[f[0] for f in FAULTS])
def test_ingest_survives_transient_s3_faults(via_proxy, fault, every, tmp_path, fault_table):
    url = f"s3://faults-ingest-{fault}/digits"
    with via_proxy(fault, every) as proxy:
        write_dataset(url, digits_source(0.2, 0), shard_samples=128)
        ok = _same_dataset(url)
    assert proxy.injected > 0, "no fault was injected: the test proves nothing"
    assert ok
    fault_table.append(
        (f"S3 {fault} every {every}th request", "ingest", "finished", 0, "none", proxy.injected)
    )


@pytest.mark.parametrize("fault, every", FAULTS, ids=[f[0] for f in FAULTS])
def test_cache_reads_survive_transient_s3_faults(
    s3, via_proxy, fault, every, tmp_path, fault_table
):
    url = f"s3://faults-cache-{fault}/digits"
    manifest = write_dataset(url, digits_source(0.2, 0), shard_samples=128)  # no faults here
    with via_proxy(fault, every) as proxy:
        cache = ShardCache(url, tmp_path / "cache", budget_bytes=10**8)
        xs = [
            decode_shard(cache.read(s.key, s.sha256), s.key)[0]
            for s in manifest.splits["train"].shards
        ]
    assert proxy.injected > 0
    assert sum(len(x) for x in xs) == 1437
    fault_table.append(
        (
            f"S3 {fault} every {every}th request",
            "shard cache",
            "finished",
            0,
            "none",
            proxy.injected,
        )
    )


@pytest.mark.parametrize("fault, every", FAULTS[:2], ids=[f[0] for f in FAULTS[:2]])
def test_checkpoints_survive_transient_s3_faults(s3, via_proxy, fault, every, fault_table):
    bucket = f"faults-ckpt-{fault}"
    CheckpointStore(f"s3://{bucket}/run").fs.mkdir(bucket)
    with via_proxy(fault, every) as proxy:
        store = CheckpointStore(f"s3://{bucket}/run")
        for step in (10, 20, 30):
            store.save(step, {"step": step, "w": torch.full((256,), float(step))})
        loaded = CheckpointStore(f"s3://{bucket}/run").load()
    assert proxy.injected > 0
    assert loaded["step"] == 30 and torch.equal(loaded["w"], torch.full((256,), 30.0))
    fault_table.append(
        (
            f"S3 {fault} every {every}th request",
            "checkpoints",
            "finished",
            0,
            "none",
            proxy.injected,
        )
    )


def test_missing_bucket_fails_fast_naming_it(s3, fault_table):
    with pytest.raises(DatasetError) as e:
        read_manifest("s3://no-such-bucket-hetflow/digits")
    assert "s3://no-such-bucket-hetflow" in str(e.value) and "no such bucket" in str(e.value)
    fault_table.append(("no such bucket", "read manifest", "refused, object named", 0, "none", 0))


def test_corrupt_cached_shard_is_fetched_again(s3, tmp_path, fault_table):
    url = "s3://faults-corrupt/digits"
    manifest = write_dataset(url, digits_source(0.2, 0), shard_samples=512)
    shard = manifest.splits["train"].shards[0]
    cache = ShardCache(url, tmp_path / "cache", budget_bytes=10**8)
    good = cache.read(shard.key, shard.sha256)
    path = cache.local_path(shard.key)
    path.write_bytes(path.read_bytes()[: len(good) // 2])  # truncated on disk
    again = cache.read(shard.key, shard.sha256)
    assert again == good and cache.stats.corrupt_replaced == 1
    x, _ = decode_shard(again, shard.key)
    assert np.isfinite(x).all()
    fault_table.append(("truncated cached shard", "shard cache", "finished", 0, "none", 1))
