"""A rank's view of the dataset: shards read through the local cache into memory."""

from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np

from hetflow.config import DatasetSpec
from infra.cache import ShardCache
from infra.datasets import Manifest, decode_shard, read_manifest
from infra.paths import default_cache_dir


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


def open_cache(spec: DatasetSpec) -> ShardCache:
    directory = spec.cache_dir or default_cache_dir()
    return ShardCache(spec.url, directory, int(spec.cache_mb * 1e6), prefetch_depth=spec.prefetch)


def load_split(manifest: Manifest, split: str, cache: ShardCache) -> Split:
    xs, ys = [], []
    for shard in manifest.splits[split].shards:
        x, y = decode_shard(cache.read(shard.key, shard.sha256), f"{manifest.url}/{shard.key}")
        if len(x) != shard.samples:
            raise ValueError(
                f"{manifest.url}/{shard.key}: holds {len(x)} samples, manifest says {shard.samples}"
            )
        xs.append(x)
        ys.append(y)
    return Split(np.concatenate(xs), np.concatenate(ys))


def load_rank_data(spec: DatasetSpec) -> RankData:
    t = time.perf_counter()
    manifest = read_manifest(spec.url)
    cache = open_cache(spec)
    train = load_split(manifest, "train", cache)
    test = load_split(manifest, "test", cache)
    return RankData(manifest, train, test, cache, time.perf_counter() - t)
