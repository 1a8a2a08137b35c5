"""A rank's view of the dataset: shards read through the local cache.

Two ways to read:

- `load_rank_data(spec)`: every shard into memory once (what the torchrun worker does; small
  datasets), through the cache and with the next shards prefetched while one is decoded;
- `RankReader`: one rank's batches step by step, shard by shard, in the shard-local stream order
  (training/partition.py), holding in memory only the shards the current step needs, with a
  background reader that brings the shards of its next steps through the cache and decodes
  them while the step computes (what `hetflow bench data` measures).

The shard-local order needs every sample's label before any shard is read; the manifest's label
histograms give them: within a shard, samples are numbered class by class (a stable sort by
label), which is the same order `RankReader` applies to a shard once it is read.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass

import numpy as np

from hetflow.config import DatasetSpec
from hetflow.infra.cache import ShardCache
from hetflow.infra.datasets import (
    DatasetError,
    Manifest,
    ShardInfo,
    check_shard,
    check_shards,
    decode_shard,
    read_manifest,
)
from hetflow.infra.paths import default_cache_dir
from hetflow.training.partition import PartitionError, ShardSchedule, Stream, check_plan


@dataclass
class Split:
    x: np.ndarray
    y: np.ndarray


@dataclass
class RankData:
    manifest: Manifest
    train: Split
    test: Split
    cache: ShardCache
    load_s: float


def open_cache(spec: DatasetSpec, **overrides) -> ShardCache:
    """The spec's cache; the emulated S3 fields are read when the config has them."""
    kw = {
        "budget_bytes": int(spec.cache_mb * 1e6),
        "latency_s": float(getattr(spec, "s3_latency_ms", 0.0) or 0.0) / 1e3,
        "mbps": getattr(spec, "s3_mbps", None),
        "prefetch_depth": spec.prefetch,
        **overrides,
    }
    return ShardCache(spec.url, spec.cache_dir or default_cache_dir(), **kw)


def read_shard(
    manifest: Manifest, shard: ShardInfo, cache: ShardCache
) -> tuple[np.ndarray, np.ndarray]:
    """One shard, through the cache, decoded and checked against the manifest."""
    name = manifest.shard_url(shard)
    x, y = decode_shard(cache.read(shard.key, shard.sha256), name)
    check_shard(shard, x, y, name)
    return x, y


def load_split(manifest: Manifest, split: str, cache: ShardCache) -> Split:
    if split not in manifest.splits:
        raise DatasetError(f"{manifest.url}: no split {split!r} (has {sorted(manifest.splits)})")
    shards = manifest.splits[split].shards
    xs, ys = [], []
    for i, shard in enumerate(shards):
        cache.prefetch([(s.key, s.sha256) for s in shards[i + 1 :]])
        x, y = read_shard(manifest, shard, cache)
        xs.append(x)
        ys.append(y)
    return Split(np.concatenate(xs), np.concatenate(ys))


def load_rank_data(spec: DatasetSpec) -> RankData:
    t = time.perf_counter()
    manifest = read_manifest(spec.url)
    check_shards(manifest)  # one listing: a missing shard fails here, not mid-load
    cache = open_cache(spec)
    train = load_split(manifest, "train", cache)
    test = load_split(manifest, "test", cache)
    return RankData(manifest, train, test, cache, time.perf_counter() - t)


def check_world(manifest: Manifest, plan: Sequence[int], split: str = "train") -> None:
    """DatasetError naming the dataset when the plan cannot share its samples (ranks > samples)."""
    try:
        check_plan(manifest.splits[split].samples, plan, f"{manifest.url} ({split} split)")
    except PartitionError as e:
        raise DatasetError(str(e)) from None


def shard_layout(manifest: Manifest, split: str) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(labels, shard of each sample, offset of each shard) in the class-by-class numbering."""
    labels, shard_of, offsets = [], [], [0]
    for i, shard in enumerate(manifest.splits[split].shards):
        classes = sorted(c for c, n in shard.labels.items() if n)
        labels.append(np.repeat(classes, [shard.labels[c] for c in classes]))
        shard_of.append(np.full(shard.samples, i))
        offsets.append(offsets[-1] + shard.samples)
    return np.concatenate(labels), np.concatenate(shard_of), np.asarray(offsets[:-1])


class RankReader:
    """One rank's batches of a split, read shard by shard through `cache`.

    `batch(step, plan)` returns the rank's samples of that step (the same for a given seed,
    whatever the cache does). With `prefetch` = D > 0, a background reader keeps the next D
    shards of the rank's schedule coming: each is read through the cache (so it is fetched,
    validated and stored there) and decoded off the training thread; a step then finds its
    shards ready. `reads` counts shard reads. With no cache it only plans (`needed`,
    `shard_reads`).
    """

    def __init__(
        self,
        manifest: Manifest,
        split: str,
        cache: ShardCache | None,
        rank: int,
        seed: int,
        block: int = 1,
        prefetch: int = 0,
    ) -> None:
        self.manifest, self.cache, self.rank = manifest, cache, rank
        self.shards = manifest.splits[split].shards
        labels, self.shard_of, self.offsets = shard_layout(manifest, split)
        self.stream = Stream(labels, seed, shards=self.shard_of, block=block)
        self.depth = prefetch
        self.held: dict[int, tuple[np.ndarray, np.ndarray]] = {}
        self.reads = 0
        self._lock = threading.Lock()
        self._ahead: dict[int, Future] = {}
        self._pool = ThreadPoolExecutor(min(prefetch, 8), "shard-reader") if prefetch > 0 else None
        self._schedule: ShardSchedule | None = None

    def needed(self, step: int, plan: Sequence[int]) -> list[int]:
        if self._schedule is None or self._schedule.plan != list(plan):
            self._schedule = ShardSchedule(self.stream, self.shard_of, plan, self.rank)
        self._schedule.forget_before(step)
        return self._schedule(step)

    def _load(self, s: int) -> tuple[np.ndarray, np.ndarray]:
        x, y = read_shard(self.manifest, self.shards[s], self.cache)
        order = np.argsort(y, kind="stable")
        with self._lock:
            self.reads += 1
        return x[order], y[order]

    def batch(self, step: int, plan: Sequence[int]) -> tuple[np.ndarray, np.ndarray]:
        need = self.needed(step, plan)
        missing = [s for s in need if s not in self.held]
        if self._pool is not None:
            wanted = missing + self._schedule.upcoming(step, self.depth)
            for s in [s for s in self._ahead if s not in wanted and s not in need]:
                self._ahead.pop(s).cancel()  # the plan changed: no longer on the schedule
            for s in wanted:
                if s not in self._ahead:
                    self._ahead[s] = self._pool.submit(self._load, s)
        for s in missing:
            pending = self._ahead.pop(s, None)
            self.held[s] = pending.result() if pending is not None else self._load(s)
        for s in [s for s in self.held if s not in need]:
            del self.held[s]
        idx = self.stream.step_indices(step, plan, self.rank)
        which = self.shard_of[idx]
        local = idx - self.offsets[which]
        x = np.empty((len(idx), self.manifest.features), dtype=np.float32)
        y = np.empty(len(idx), dtype=np.int64)
        for s in need:
            m = which == s
            x[m], y[m] = self.held[s][0][local[m]], self.held[s][1][local[m]]
        return x, y

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=True, cancel_futures=True)
            self._ahead.clear()

    def __enter__(self) -> RankReader:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def shard_reads(reader: RankReader, steps: range, plan: Sequence[int]) -> list[list[int]]:
    """The shards `reader.batch` reads at each step, computed without reading (for models)."""
    held: set[int] = set(reader.held)
    out = []
    for step in steps:
        need = reader.needed(step, plan)
        out.append([s for s in need if s not in held])
        held = set(need)
    return out
