"""A local shard cache: byte budget with LRU eviction, checksum-validated, atomic, multi-process.

fsspec's `filecache`/`simplecache` filesystems download whole files to a local directory, but
they have no byte budget, do not validate content against a known checksum, and their metadata
is not safe when several ranks on one host share the directory. This class adds exactly that on
top of fsspec's transfer (`fs.cat_file`): one file per shard named by a hash of its source (so a
key such as `../../etc/passwd` cannot escape the directory), written to a temporary file and
renamed into place (a crash never leaves a half file under the final name), validated by SHA-256
on every open, guarded by an `fcntl` lock per entry, and evicted least-recently-used first.
"""

from __future__ import annotations

import fcntl
import hashlib
import os
import tempfile
import threading
import time
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

from infra.s3 import filesystem


class ChecksumError(ValueError):
    """The source itself holds bytes that do not match the manifest (names the object)."""


@dataclass
class CacheStats:
    hits: int = 0
    misses: int = 0
    bytes_read: int = 0  # from the source (S3), not from the cache
    corrupt_replaced: int = 0
    evictions: int = 0
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    @property
    def hit_ratio(self) -> float:
        total = self.hits + self.misses
        return self.hits / total if total else 0.0


def _sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


class ShardCache:
    """Read `base_url/key` through a local directory shared by the ranks of one host.

    `latency_s` and `mbps` emulate a slow object store on loopback (0 and None: off).
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
        self.base_url = base_url.rstrip("/")
        self.fs, self.root = filesystem(self.base_url)
        self.dir = Path(directory).resolve()
        self.dir.mkdir(parents=True, exist_ok=True)
        self.budget = int(budget_bytes)
        self.latency_s = latency_s
        self.mbps = mbps
        self.stats = CacheStats()
        self._pool = ThreadPoolExecutor(1) if prefetch_depth > 0 else None
        self._pending: dict[str, Future] = {}

    def local_path(self, key: str) -> Path:
        digest = hashlib.sha256(f"{self.base_url}/{key}".encode()).hexdigest()[:24]
        return self.dir / f"{digest}.shard"

    def read(self, key: str, sha256: str) -> bytes:
        """The shard's bytes, from the cache when valid, else from the source (then cached)."""
        pending = self._pending.pop(key, None)
        if pending is not None:
            pending.result()
        return self._read(key, sha256, count=True)

    def prefetch(self, keys: list[tuple[str, str]]) -> None:
        """Start fetching (key, sha256) pairs in the background, in order."""
        if self._pool is None:
            return
        for key, sha in keys:
            if key not in self._pending:
                self._pending[key] = self._pool.submit(self._read, key, sha, False)

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=True, cancel_futures=True)

    def _read(self, key: str, sha256: str, count: bool) -> bytes:
        path = self.local_path(key)
        with _locked(path):
            data = _read_if_valid(path, sha256)
            if data is not None:
                os.utime(path)  # LRU order is modification time
                if count:
                    with self.stats._lock:
                        self.stats.hits += 1
                return data
            if path.exists():
                with self.stats._lock:
                    self.stats.corrupt_replaced += 1
            data = self._fetch(key)
            if _sha256(data) != sha256:
                raise ChecksumError(
                    f"{self.base_url}/{key}: checksum mismatch at the source (expected {sha256[:12]}…)"
                )
            _atomic_write(path, data)
            with self.stats._lock:
                if count:
                    self.stats.misses += 1
                self.stats.bytes_read += len(data)
        self._evict(keep=path)
        return data

    def _fetch(self, key: str) -> bytes:
        try:
            data = self.fs.cat_file(f"{self.root}/{key}")
        except FileNotFoundError:
            raise FileNotFoundError(f"{self.base_url}/{key}: no such object") from None
        if self.latency_s or self.mbps:
            time.sleep(self.latency_s + (len(data) * 8 / (self.mbps * 1e6) if self.mbps else 0))
        return data

    def _evict(self, keep: Path) -> None:
        entries = sorted(
            (p.stat().st_mtime, p.stat().st_size, p) for p in self.dir.glob("*.shard") if p.exists()
        )
        total = sum(size for _, size, _ in entries)
        for _, size, p in entries:
            if total <= self.budget:
                break
            if p == keep:
                continue
            with _locked(p):
                p.unlink(missing_ok=True)
            total -= size
            with self.stats._lock:
                self.stats.evictions += 1


def _read_if_valid(path: Path, sha256: str) -> bytes | None:
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        return None
    return data if _sha256(data) == sha256 else None


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


class _locked:
    """An exclusive `fcntl` lock on `<path>.lock`, shared by every process on the host."""

    def __init__(self, path: Path) -> None:
        self.lock_path = path.with_suffix(".lock")

    def __enter__(self) -> None:
        self.fd = os.open(self.lock_path, os.O_CREAT | os.O_RDWR, 0o644)
        fcntl.flock(self.fd, fcntl.LOCK_EX)

    def __exit__(self, *exc) -> None:
        fcntl.flock(self.fd, fcntl.LOCK_UN)
        os.close(self.fd)
