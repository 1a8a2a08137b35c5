"""The shard cache against a moto S3 over HTTP: budget, LRU, checksums, atomicity, processes."""

from __future__ import annotations

import multiprocessing
from pathlib import Path

import numpy as np
import pytest

import hetflow.infra.data.cache as cache_mod
from hetflow.infra.data.cache import ChecksumError, ShardCache
from hetflow.infra.data.format import synthetic_source, write_dataset
from hetflow.infra.s3 import local_endpoint_environ


@pytest.fixture(scope="module")
def dataset(s3_server):
    """8 train shards of 16 samples in S3 (moto over HTTP), written once for the module."""
    url = "s3://hetflow-test-cache/syn"
    with local_endpoint_environ(s3_server):
        manifest = write_dataset(url, synthetic_source(129, 0.01, seed=3), shard_samples=16)
    train = manifest.splits["train"].shards
    assert len(train) == 8
    return url, [(s.key, s.sha256, s.bytes) for s in train]


@pytest.fixture
def shards(s3, dataset):
    """[(key, sha256, bytes), ...] of the shards and the dataset URL; S3 env set for the test."""
    return dataset


def _cached(cache: ShardCache) -> list[Path]:
    return sorted(cache.dir.glob("*.shard"))


def test_corrupt_or_truncated_cached_shard_is_fetched_again(shards, tmp_path):
    url, keys = shards
    key, sha, size = keys[0]
    cache = ShardCache(url, tmp_path / "c", budget_bytes=10**6)
    good = cache.read(key, sha)
    path = cache.local_path(key)
    assert path.read_bytes() == good and cache.stats.misses == 1 and cache.stats.bytes_read == size

    data = bytearray(good)
    data[len(data) // 2] ^= 0xFF  # one flipped bit pattern, same size
    path.write_bytes(bytes(data))
    assert cache.read(key, sha) == good
    path.write_bytes(good[: size // 3])  # truncated
    assert cache.read(key, sha) == good
    path.write_bytes(b"")  # empty
    assert cache.read(key, sha) == good

    assert cache.stats.corrupt_replaced == 3
    assert cache.stats.misses == 4 and cache.stats.hits == 0
    assert cache.stats.s3_bytes_read == 4 * size
    assert path.read_bytes() == good
    assert cache.read(key, sha) == good and cache.stats.hits == 1
    assert cache.stats.cache_hit_ratio == pytest.approx(1 / 5)


def test_checksum_failure_at_the_source_names_the_object_and_caches_nothing(shards, tmp_path):
    url, keys = shards
    key, sha, _ = keys[2]
    cache = ShardCache(url, tmp_path / "c", budget_bytes=10**6)
    with pytest.raises(ChecksumError, match=rf"^{url}/{key}: checksum mismatch at the source"):
        cache.read(key, "0" * 64)
    assert _cached(cache) == []
    with pytest.raises(FileNotFoundError, match=rf"{url}/train/nope.npz: no such object"):
        cache.read("train/nope.npz", sha)


def test_lru_eviction_keeps_the_budget_and_the_recently_used(shards, tmp_path):
    url, keys = shards
    size = keys[0][2]
    assert all(k[2] == size for k in keys)
    cache = ShardCache(url, tmp_path / "c", budget_bytes=int(2.5 * size))
    a, b, c, d = keys[:4]
    for k in (a, b):
        cache.read(k[0], k[1])
    cache.read(c[0], c[1])  # over budget: a, the least recently used, goes
    assert not cache.local_path(a[0]).exists()
    assert cache.local_path(b[0]).exists() and cache.local_path(c[0]).exists()
    cache.read(b[0], b[1])  # a hit makes b the most recent
    cache.read(d[0], d[1])  # so c goes, not b
    assert cache.local_path(b[0]).exists() and cache.local_path(d[0]).exists()
    assert not cache.local_path(c[0]).exists()
    assert cache.cached_bytes() <= cache.budget
    assert cache.stats.evictions == 2 and cache.stats.hits == 1 and cache.stats.misses == 4


def test_a_shard_larger_than_the_budget_is_served_and_the_rest_evicted(shards, tmp_path):
    url, keys = shards
    cache = ShardCache(url, tmp_path / "c", budget_bytes=keys[0][2] // 2)
    for key, sha, _ in keys[:3]:
        cache.read(key, sha)
    assert _cached(cache) == [cache.local_path(keys[2][0])]


def test_budget_zero_reads_through_to_s3_every_time(shards, tmp_path):
    url, keys = shards
    key, sha, size = keys[0]
    cache = ShardCache(url, tmp_path / "c", budget_bytes=0, prefetch_depth=3)
    for _ in range(3):
        cache.read(key, sha)
    assert (
        _cached(cache) == [] and cache.stats.misses == 3 and cache.stats.s3_bytes_read == 3 * size
    )
    cache.prefetch([(key, sha)])  # nowhere to put it: a no-op
    assert cache.stats.prefetched == 0


def test_a_failed_write_leaves_neither_a_shard_nor_a_part_file(shards, tmp_path, monkeypatch):
    url, keys = shards
    key, sha, _ = keys[0]
    cache = ShardCache(url, tmp_path / "c", budget_bytes=10**6)

    def disk_full(fd):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(cache_mod.os, "fsync", disk_full)
    with pytest.raises(OSError, match="No space left"):
        cache.read(key, sha)
    monkeypatch.undo()
    assert _cached(cache) == [] and list(cache.dir.glob("*.part")) == []
    assert len(cache.read(key, sha)) == keys[0][2]


BAD_KEYS = ["../../escaped", "/etc/passwd", "a/../../../x", "..", "~/x", "a\\..\\b", "x/\x00y"]


def test_a_key_cannot_name_a_path_outside_the_cache(shards, tmp_path):
    url, keys = shards
    cache_dir = tmp_path / "deep" / "er" / "cache"
    cache = ShardCache(url, cache_dir, budget_bytes=10**6)
    for key in BAD_KEYS:
        path = cache.local_path(key)
        assert path.parent == cache_dir.resolve() and path.name.endswith(".shard"), key
    with pytest.raises(FileNotFoundError):
        cache.read("../../escaped", keys[0][1])
    assert not (tmp_path / "deep" / "escaped").exists()
    outside = [
        p for p in tmp_path.rglob("*") if p.is_file() and cache_dir.resolve() not in p.parents
    ]
    assert outside == []


def test_prefetch_brings_the_next_shards_in_up_to_its_depth(shards, tmp_path):
    url, keys = shards
    cache = ShardCache(url, tmp_path / "c", budget_bytes=10**6, prefetch_depth=2)
    cache.prefetch([(k, s) for k, s, _ in keys[:4]])
    cache.close()  # waits for the background reads
    assert [cache.local_path(k).exists() for k, _, _ in keys[:4]] == [True, True, False, False]
    assert cache.stats.prefetched == 2 and cache.stats.misses == 0
    assert cache.stats.s3_bytes_read == keys[0][2] + keys[1][2]
    # Reading a prefetched shard waits for nothing but is still a miss: S3 served it.
    assert cache.read(keys[0][0], keys[0][1]) and cache.stats.misses == 1
    assert cache.read(keys[0][0], keys[0][1]) and cache.stats.hits == 1
    assert cache.read(keys[2][0], keys[2][1]) and cache.stats.misses == 2


def _read_all(args) -> list[str]:
    """One process of the shared-cache test: read every key, several rounds, report checksums."""
    import hashlib

    url, directory, budget, keys, seed = args
    cache = ShardCache(url, directory, budget_bytes=budget)
    order = np.random.default_rng(seed)
    out = []
    for _ in range(3):
        for i in order.permutation(len(keys)):
            key, sha, _ = keys[i]
            out.append(hashlib.sha256(cache.read(key, sha)).hexdigest() == sha)
    return [all(out), cache.stats.hits, cache.stats.misses]


def test_processes_that_miss_the_same_shard_fetch_it_once(shards, tmp_path):
    url, keys = shards
    budget = 100 * keys[0][2]  # every shard fits: after one fetch each, all reads are hits
    ctx = multiprocessing.get_context("spawn")
    with ctx.Pool(4) as pool:
        results = pool.map(
            _read_all, [(url, str(tmp_path / "shared"), budget, keys, s) for s in range(4)]
        )
    assert all(ok for ok, _, _ in results)
    assert sum(m for _, _, m in results) == len(keys)  # the entry lock: one fetch per shard


def test_processes_sharing_one_cache_all_get_valid_data(shards, tmp_path):
    url, keys = shards
    size = keys[0][2]
    directory = tmp_path / "shared"
    budget = 5 * size  # smaller than the 8 shards: processes evict under each other
    ctx = multiprocessing.get_context("spawn")
    with ctx.Pool(4) as pool:
        results = pool.map(_read_all, [(url, str(directory), budget, keys, s) for s in range(4)])
    assert all(ok for ok, _, _ in results)
    assert sum(h + m for _, h, m in results) == 4 * 3 * len(keys)
    assert list(directory.glob("*.part")) == []
    files = list(directory.glob("*.shard"))
    assert sum(f.stat().st_size for f in files) <= budget
    survivor = ShardCache(url, directory, budget_bytes=budget)
    by_path = {survivor.local_path(k): (k, s) for k, s, _ in keys}
    for f in files:  # every file left is whole and under its own name
        key, sha = by_path[f]
        assert survivor.read(key, sha) == f.read_bytes()
    assert survivor.stats.hits == len(files) and survivor.stats.misses == 0
