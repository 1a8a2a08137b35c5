"""The shard cache against a moto S3 over HTTP: budget, LRU, checksums, atomicity, processes."""

from __future__ import annotations

import os
import time

import pytest

import hetflow.infra.data.cache as cache_mod
from hetflow.emulation.store import EmulatedStore
from hetflow.infra.data.cache import ShardCache


def test_stale_part_files_of_killed_processes_are_removed(tmp_path):
    d = tmp_path / "c"
    d.mkdir()
    old, fresh = d / ".tmp-old.part", d / ".tmp-fresh.part"
    old.write_bytes(b"half")
    fresh.write_bytes(b"being written")
    past = time.time() - 2 * cache_mod.STALE_PART_S
    os.utime(old, (past, past))
    ShardCache("file:///nonexistent-dataset", d, budget_bytes=100)
    assert not old.exists() and fresh.exists()


def test_emulated_store_overlaps_latency_and_queues_bytes(monkeypatch):
    """Latency per request overlaps; bytes share one link (a fake clock: no wall time)."""
    clock = [0.0]
    monkeypatch.setattr(cache_mod.time, "perf_counter", lambda: clock[0])
    monkeypatch.setattr(cache_mod.time, "sleep", lambda s: clock.__setitem__(0, clock[0] + s))
    store = EmulatedStore(latency_s=0.05, mbps=8.0)  # 1 MB/s
    store.delay(100_000, started=0.0)  # 50 ms + 100 ms
    assert clock[0] == pytest.approx(0.15)
    clock[0] = 0.0
    store2 = EmulatedStore(latency_s=0.05, mbps=8.0)
    store2.delay(100_000, started=0.0)  # two requests started together: ends at 0.15
    clock[0] = 0.0
    store2.delay(100_000, started=0.0)  # ... and its bytes queue behind the first: 0.25
    assert clock[0] == pytest.approx(0.25)
    with pytest.raises(ValueError):
        EmulatedStore(latency_s=-1)
