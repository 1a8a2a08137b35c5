"""A rank's view of the dataset: its share of each step, streamed from S3 through the cache.

Nothing is loaded whole. `open_rank_data(spec)` reads the manifest and opens the host's shard
cache (bounded, checksum-validated, shared by the host's ranks: infra/data/cache.py); then

- `RankReader` hands out one rank's batches step by step, shard by shard, in the shard-local
  stream order (infra/data/partition.py): it holds in memory only the shards the current step
  needs, and a background reader brings the shards of its next steps through the cache and
  decodes them while the step computes. A rank's memory for data is therefore those shards plus
  `prefetch` decoded shards, whatever the dataset's size; the cache's budget bounds its disk.
  The sample index and the epoch orders it plans from are O(shards x classes), not per sample.
  The batch of a step depends only on (seed, step, plan), so a re-plan mid-epoch and a restart
  from a checkpoint keep every sample read exactly once per epoch.
- `RankData.eval_batches` reads a split in bounded batches (one decoded shard at a time).

The shard-local order needs every shard's class counts before any shard is read; the manifest's
label histograms give them: within a shard, samples are numbered class by class (a stable sort
by label), the order `training.shards.decode_samples` gives a shard once it is read, so the
k-th sample of a class in a shard has a known number without a table per sample. Token windows
(label 0) are numbered in the order of the tokens.
"""

from __future__ import annotations

import resource
import threading
import time
from collections.abc import Iterator, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass

import numpy as np

from hetflow.config import DatasetSpec
from hetflow.infra.data.cache import ShardCache
from hetflow.infra.data.format import DatasetError, Manifest, ShardInfo, check_shards, read_manifest
from hetflow.infra.data.partition import PartitionError, ShardSchedule, Stream, check_plan
from hetflow.infra.data.shards import check_context, decode_samples, empty_samples, split_layout
from hetflow.infra.paths import default_cache_dir


@dataclass
class Split:
    x: np.ndarray
    y: np.ndarray


class RankData:
    """What a rank reads from: the dataset's manifest and this host's shard cache.

    Nothing of the dataset is loaded here: `reader` streams the rank's share of each step,
    `eval_batches` a split in bounded batches, `head` the first few samples (for the probes).
    `context`: tokens per training window, for token data (the recipe's).
    """

    def __init__(
        self, manifest: Manifest, cache: ShardCache, prefetch: int, context: int | None = None
    ) -> None:
        self.manifest, self.cache, self.prefetch, self.context = manifest, cache, prefetch, context
        self.load_s = 0.0
        self._readers: list[RankReader] = []

    def reader(self, rank: int, seed: int, split: str = "train") -> RankReader:
        """Rank `rank`'s batches of `split`, prefetched `prefetch` shards ahead (closed by
        `close`)."""
        r = RankReader(
            self.manifest,
            split,
            self.cache,
            rank,
            seed,
            prefetch=self.prefetch,
            context=self.context,
        )
        self._readers.append(r)
        return r

    def eval_batches(
        self, split: str = "test", batch: int = 512, limit: int | None = None
    ) -> Iterator[tuple[np.ndarray, np.ndarray]]:
        """`split` in batches of at most `batch` samples, shard by shard in the manifest's
        order, through the cache (the next shard prefetched while one is used): at most one
        decoded shard and one batch in memory. `limit`: only the first `limit` samples (a
        fixed subset, the same at every evaluation)."""
        layout = split_layout(self.manifest, split, self.context)
        left = layout.total if limit is None else min(limit, layout.total)
        for i, shard in enumerate(layout.shards):
            if left <= 0:
                return
            self.cache.prefetch([(s.key, s.sha256) for s in layout.shards[i + 1 : i + 2]])
            x, y = read_samples(self.manifest, shard, self.cache, self.context)
            x, y = x[:left], y[:left]
            left -= len(x)
            for a in range(0, len(x), batch):
                yield x[a : a + batch], y[a : a + batch]

    def head(self, split: str, n: int) -> Split:
        """The first `n` samples of `split` (fewer if it is smaller), read from its first shards."""
        xs, ys = zip(*self.eval_batches(split, batch=n, limit=n), strict=True)
        return Split(np.concatenate(xs), np.concatenate(ys))

    def close(self) -> None:
        for r in self._readers:
            r.close()
        self.cache.close()


def peak_rss_bytes() -> int:
    """This process's peak resident memory so far (Linux reports kilobytes)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def open_cache(spec: DatasetSpec, **overrides) -> ShardCache:
    """The spec's cache; the emulated S3 fields are read when the config has them."""
    kw = {
        "budget_bytes": int(spec.cache_mb * 1e6),
        "latency_s": float(getattr(spec, "s3_latency_ms", 0.0) or 0.0) / 1e3,
        "mbps": getattr(spec, "s3_mbps", None) or None,
        "prefetch_depth": spec.prefetch,
        **overrides,
    }
    return ShardCache(spec.url, spec.cache_dir or default_cache_dir(), **kw)


def read_samples(
    manifest: Manifest, shard: ShardInfo, cache: ShardCache, context: int | None = None
) -> tuple[np.ndarray, np.ndarray]:
    """One shard through the cache (checksum-validated), decoded into its samples class by
    class and checked against the manifest."""
    return decode_samples(manifest, shard, cache.read(shard.key, shard.sha256), context)


def open_rank_data(
    spec: DatasetSpec, context: int | None = None, manifest: Manifest | None = None
) -> RankData:
    """The manifest, checked (one listing: a missing shard fails here, not mid-run, and a
    context that does not fit the data too), and the host's cache. Reads no shard.
    `manifest`: one its launcher read and listed already (the rank then asks S3 nothing)."""
    t = time.perf_counter()
    if manifest is None:
        manifest = read_manifest(spec.url)
        check_shards(manifest)
    check_context(manifest, context)
    data = RankData(manifest, open_cache(spec, prefetch_depth=1), spec.prefetch, context)
    data.load_s = time.perf_counter() - t
    return data


def check_world(
    manifest: Manifest, plan: Sequence[int], split: str = "train", context: int | None = None
) -> None:
    """DatasetError naming the dataset when the plan cannot share its samples (ranks > samples;
    for token data, samples are windows of `context`)."""
    try:
        n = split_layout(manifest, split, context).total
        check_plan(n, plan, f"{manifest.url} ({split} split)")
    except PartitionError as e:
        raise DatasetError(str(e)) from None


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
        context: int | None = None,
    ) -> None:
        self.manifest, self.cache, self.rank, self.context = manifest, cache, rank, context
        layout = split_layout(manifest, split, context)
        self.shards, self.offsets = layout.shards, layout.offsets
        self.stream = Stream(layout.index, seed, block=block)
        self.depth = prefetch
        self.held: dict[int, tuple[np.ndarray, np.ndarray]] = {}
        self.reads = 0
        self._lock = threading.Lock()
        self._ahead: dict[int, Future] = {}
        self._pool = ThreadPoolExecutor(min(prefetch, 8), "shard-reader") if prefetch > 0 else None
        self._schedule: ShardSchedule | None = None

    def needed(self, step: int, plan: Sequence[int]) -> list[int]:
        if self._schedule is None or self._schedule.plan != list(plan):
            self._schedule = ShardSchedule(self.stream, plan, self.rank)
        self._schedule.forget_before(step)
        return self._schedule(step)

    def upcoming(self, step: int, plan: Sequence[int], depth: int) -> list[int]:
        """The first `depth` shards that steps after `step` read and `step` does not (the
        prefetch's next shards, assuming the plan holds)."""
        self.needed(step, plan)
        return self._schedule.upcoming(step, depth)

    def _load(self, s: int) -> tuple[np.ndarray, np.ndarray]:
        x, y = read_samples(self.manifest, self.shards[s], self.cache, self.context)
        with self._lock:
            self.reads += 1
        return x, y

    def batch(self, step: int, plan: Sequence[int]) -> tuple[np.ndarray, np.ndarray]:
        need = self.needed(step, plan)
        missing = [s for s in need if s not in self.held]
        if self._pool is not None:
            wanted = missing + self._schedule.upcoming(step, self.depth)  # needed() set it
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
        idx = self._schedule.indices(step)  # the schedule's: computed once
        which = self.stream.index.shard_of(idx)
        local = idx - self.offsets[which]
        first = self.held[need[0]][0] if need else empty_samples(self.manifest, self.context)
        x = np.empty((len(idx), *first.shape[1:]), dtype=first.dtype)
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
