"""A local shard cache: byte budget with LRU eviction, checksum-validated, atomic, multi-process.

The transfer is fsspec's (`fs.cat_file`: s3fs, with botocore's retries); this adds what its
`simplecache`/`filecache` lack: a byte budget, SHA-256 checked on every read (a bad local copy
is fetched again; bytes that fail at the source raise ChecksumError), and one directory shared
safely by the ranks of a host. Each shard is a file named by a hash of its URL, written to a
`.part` file and renamed, under an `fcntl` lock per entry: two ranks that miss one shard fetch
it once, and eviction (least recently used, down to the budget) never removes a file being
read. `prefetch` reads the next shards of a schedule in a thread pool; an emulated object
store (latency per request, shared bandwidth) shows caching's effect on loopback. A budget of
0 reads every shard from the source (the `no_cache` baseline).
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import os
import tempfile
import threading
import time
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

from hetflow.emulation.store import EmulatedStore
from hetflow.infra.data.format import ChecksumError
from hetflow.infra.data.format import sha256 as sha256_of
from hetflow.infra.s3 import filesystem

__all__ = ["CacheStats", "ChecksumError", "ShardCache"]

STALE_PART_S = 3600.0


@dataclass
class CacheStats:
    """Counters of one process's cache.

    Every `read` is a hit (served by a valid local file) or a miss (its bytes came from the
    source for it, also when a prefetch fetched them ahead of the read): the hit ratio is what
    the cache saved from S3, whether or not prefetch hid the latency.
    """

    hits: int = 0
    misses: int = 0
    bytes_read: int = 0  # from the source (S3), not from the cache; prefetches included
    prefetched: int = 0  # shards the background reader fetched from the source
    corrupt_replaced: int = 0
    evictions: int = 0
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    @property
    def hit_ratio(self) -> float:
        total = self.hits + self.misses
        return self.hits / total if total else 0.0

    cache_hit_ratio = hit_ratio

    @property
    def s3_bytes_read(self) -> int:
        return self.bytes_read

    def add(self, **counts: int) -> None:
        with self._lock:
            for name, n in counts.items():
                setattr(self, name, getattr(self, name) + n)

    def snapshot(self) -> dict[str, int]:
        with self._lock:
            return {
                k: getattr(self, k)
                for k in (
                    "hits",
                    "misses",
                    "bytes_read",
                    "prefetched",
                    "corrupt_replaced",
                    "evictions",
                )
            }


class ShardCache:
    """Read `base_url/key` through a local directory shared by the ranks of one host.

    `latency_s` and `mbps` emulate a slow object store on loopback (0 and None: off). The S3
    client is made at the first read from the source, once (a rank whose shards are all cached
    makes none, nor imports s3fs): its endpoint and credentials are the environment's then.
    `prefetch_depth` > 0 starts a background reader: `prefetch(keys)` keeps the first
    `prefetch_depth` of them (the next shards of the caller's schedule) coming into the cache.
    """

    def __init__(
        self,
        base_url: str,
        directory: str | os.PathLike,
        budget_bytes: int,
        latency_s: float = 0.0,
        mbps: float | None = None,
        prefetch_depth: int = 0,
    ) -> None:
        if budget_bytes < 0 or prefetch_depth < 0:
            raise ValueError("cache budget and prefetch depth must be >= 0")
        self.base_url = base_url.rstrip("/")
        self._source: tuple | None = None  # (filesystem, root): `source`, at the first fetch
        self._source_lock = threading.Lock()
        self.dir = Path(directory).resolve()
        self.dir.mkdir(parents=True, exist_ok=True)
        self.budget = int(budget_bytes)
        self.store = EmulatedStore(latency_s, mbps)
        self.stats = CacheStats()
        self.depth = prefetch_depth if self.budget > 0 else 0
        self._pool = ThreadPoolExecutor(min(self.depth, 8), "prefetch") if self.depth else None
        self._pending: dict[str, Future] = {}
        self._fetched_ahead: set[str] = set()  # fetched by a prefetch, not read yet
        _remove_stale_parts(self.dir)

    def source(self):
        """(filesystem, root) of the source, made at the first call, under a lock: concurrent
        first reads (the caller's and a prefetch) make one S3 client between them."""
        with self._source_lock:
            if self._source is None:
                fs, root = filesystem(self.base_url)
                connect = getattr(fs, "connect", None)  # s3fs: the client now, once
                if callable(connect):
                    connect()
                self._source = (fs, root)
            return self._source

    def local_path(self, key: str) -> Path:
        digest = hashlib.sha256(f"{self.base_url}/{key}".encode()).hexdigest()[:32]
        return self.dir / f"{digest}.shard"  # a hex name: never outside the cache, whatever the key

    def read(self, key: str, sha256: str) -> bytes:
        """The shard's bytes, from the cache when valid, else from the source (then cached)."""
        pending = self._pending.pop(key, None)
        if pending is not None:
            with contextlib.suppress(Exception):  # the read below raises it again if it persists
                pending.result()
        return self._read(key, sha256, waited=True)

    def prefetch(self, keys: list[tuple[str, str]]) -> None:
        """Bring the first `prefetch_depth` (key, sha256) pairs into the cache in the
        background, in order. A shard already cached is only marked recently used
        (`read` validates it)."""
        if self._pool is None:
            return
        for k in [k for k, f in self._pending.items() if f.done()]:
            del self._pending[k]
        for key, sha in keys[: self.depth]:
            if key not in self._pending:
                self._pending[key] = self._pool.submit(self._read, key, sha, False)

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=True, cancel_futures=True)
            self._pending.clear()

    def __enter__(self) -> ShardCache:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def _read(self, key: str, sha256: str, waited: bool) -> bytes | None:
        """`waited`: the caller's read (counted, returns the bytes); else a prefetch."""
        if self.budget == 0:
            data = self._fetch(key, sha256)
            self.stats.add(misses=1, bytes_read=len(data))
            return data
        path = self.local_path(key)
        with _locked(path):
            if not waited and path.exists():
                _touch(path)  # a prefetch only keeps it; the caller's read validates it
                return None
            data = _read_if_valid(path, sha256)
            if data is not None:
                _touch(path)  # LRU: most recently used
                ahead = key in self._fetched_ahead  # a prefetch fetched it for this read
                self._fetched_ahead.discard(key)
                self.stats.add(**({"misses": 1} if ahead else {"hits": 1}))
                return data
            if path.exists():
                self.stats.add(corrupt_replaced=1)
            data = self._fetch(key, sha256)
            _atomic_write(path, data)
            _touch(path)
            if waited:
                self.stats.add(bytes_read=len(data), misses=1)
            else:
                self._fetched_ahead.add(key)
                self.stats.add(bytes_read=len(data), prefetched=1)
        self._evict(keep=path)
        return data if waited else None

    def _fetch(self, key: str, sha256: str) -> bytes:
        url = f"{self.base_url}/{key}"
        started = time.perf_counter()
        try:
            fs, root = self.source()
            data = fs.cat_file(f"{root}/{key}")
        except FileNotFoundError:
            raise FileNotFoundError(f"{url}: no such object") from None
        if self.store.active:
            self.store.delay(len(data), started)
        if sha256_of(data) != sha256:
            raise ChecksumError(
                f"{url}: checksum mismatch at the source ({len(data)} bytes, "
                f"expected SHA-256 {sha256[:12]}...)"
            )
        return data

    def _evict(self, keep: Path) -> None:
        entries = []
        for p in self.dir.glob("*.shard"):
            try:
                st = p.stat()
            except FileNotFoundError:  # another process evicted it meanwhile
                continue
            entries.append((st.st_mtime_ns, st.st_size, p))
        entries.sort()
        total = sum(size for _, size, _ in entries)
        for mtime, size, p in entries:
            if total <= self.budget:
                break
            if p == keep:
                continue
            with _locked(p):
                try:
                    if p.stat().st_mtime_ns != mtime:
                        continue  # read meanwhile (by any process): no longer least recent
                    p.unlink()
                except FileNotFoundError:
                    total -= size
                    continue
            total -= size
            self.stats.add(evictions=1)

    def cached_bytes(self) -> int:
        total = 0
        for p in self.dir.glob("*.shard"):
            try:
                total += p.stat().st_size
            except FileNotFoundError:
                pass
        return total


def _touch(path: Path) -> None:
    # time_ns, set here: the kernel's file timestamps are too coarse to order reads ms apart
    t = time.time_ns()
    os.utime(path, ns=(t, t))


def _read_if_valid(path: Path, sha256: str) -> bytes | None:
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        return None
    return data if sha256_of(data) == sha256 else None


def _atomic_write(path: Path, data: bytes) -> None:
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".tmp-", suffix=".part")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def _remove_stale_parts(directory: Path) -> None:
    """Temporary files that a killed process left behind (none is that old while being written)."""
    cutoff = time.time() - STALE_PART_S
    for p in directory.glob(".tmp-*.part"):
        try:
            if p.stat().st_mtime < cutoff:
                p.unlink()
        except FileNotFoundError:
            pass


class _locked:
    """An exclusive `fcntl` lock on `<path>.lock`, shared by every process on the host.

    The empty lock file stays: removing one that another process may be about to lock is a race.
    """

    def __init__(self, path: Path) -> None:
        self.lock_path = path.with_suffix(".lock")

    def __enter__(self) -> None:
        self.fd = os.open(self.lock_path, os.O_CREAT | os.O_RDWR, 0o644)
        fcntl.flock(self.fd, fcntl.LOCK_EX)

    def __exit__(self, *exc) -> None:
        fcntl.flock(self.fd, fcntl.LOCK_UN)
        os.close(self.fd)
