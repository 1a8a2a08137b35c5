"""The S3 probe: first-byte time and read throughput of the dataset's shards, through fsspec.

Figures: `s3_first_byte_s`, `s3_read_mbps`, `s3_bytes_probed`.
"""

from __future__ import annotations

import statistics

from hetflow.emulation.emulator import now
from hetflow.infra.data.reader import RankData
from hetflow.infra.s3 import filesystem

S3_BUDGET_S = 0.1  # wall time of the whole-shard reads


def probe_s3(data: RankData, budget_s: float = S3_BUDGET_S) -> dict:
    """First-byte latency and read throughput of the dataset's shards, through fsspec.

    Uses the filesystem the rank's cache already opened (its client is set up), and the cache's
    emulated object store when it has one, so that an emulated slow S3 shows here too.
    """
    manifest = data.manifest
    shards = sorted(
        (s for split in manifest.splits.values() for s in split.shards), key=lambda s: -s.bytes
    )
    fs, root = getattr(data.cache, "fs", None), getattr(data.cache, "root", None)
    if fs is None or root is None:
        fs, root = filesystem(manifest.url)
    store = getattr(data.cache, "store", None)
    delay = store.delay if getattr(store, "active", False) else None

    def get(key: str, **rng) -> int:
        t = now()
        got = fs.cat_file(f"{root}/{key}", **rng)
        if delay is not None:
            delay(len(got), t)
        return len(got)

    start = now()
    first = []
    for shard in shards[:2]:
        t = now()
        get(shard.key, start=0, end=1)
        first.append(now() - t)
    nbytes, t0 = 0, now()
    for shard in shards:
        nbytes += get(shard.key)
        if now() - start > budget_s:
            break
    seconds = now() - t0
    return {
        "s3_first_byte_s": float(statistics.median(first)) if first else None,
        "s3_read_mbps": float(nbytes * 8 / seconds / 1e6) if nbytes else None,
        "s3_bytes_probed": nbytes,
    }
