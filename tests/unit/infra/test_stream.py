"""A rank streams its share of each step: token windows, exactly once per epoch across re-plans
and restarts, bounded memory, and a real training run that reads through the cache."""

from __future__ import annotations

import io

import numpy as np
import pytest

from hetflow.infra.data.cache import ShardCache
from hetflow.infra.data.format import (
    DatasetError,
    Manifest,
    ShardInfo,
    SplitInfo,
    sha256,
    synthetic_source,
    write_dataset,
)
from hetflow.infra.data.reader import RankReader
from hetflow.infra.data.shards import check_context, split_layout, token_windows, windows_in
from hetflow.infra.s3 import filesystem


class TokenShard(ShardInfo):
    tokens: int


class TokenManifest(Manifest):
    kind: str = "tokens"


class ImageManifest(Manifest):
    kind: str = "images"
    shape: tuple[int, int, int] = (1, 4, 4)


def _token_dataset(url: str, lengths: list[int]) -> Manifest:
    """Token shards whose tokens are their global positions, so a window names itself."""
    fs, root = filesystem(url)
    shards, start = [], 0
    for i, n in enumerate(lengths):
        buf = io.BytesIO()
        np.save(buf, np.arange(start, start + n, dtype=np.uint16))
        data, key = buf.getvalue(), f"train/shard-{i:05d}.npy"
        fs.pipe_file(f"{root}/{key}", data)
        shards.append(
            TokenShard(
                key=key, samples=n, tokens=n, bytes=len(data), sha256=sha256(data), labels={0: n}
            )
        )
        start += n
    split = SplitInfo(samples=start, labels={0: start}, shards=shards)
    return TokenManifest(url=url, features=1, classes=1, splits={"train": split})


@pytest.fixture
def tokens(tmp_path):
    """A 6-shard token dataset in memory:// (one shard too short for a window of 8)."""
    url = f"memory://hetflow-stream/{tmp_path.name}"
    manifest = _token_dataset(url, [81, 40, 5, 57, 64, 41])
    return manifest, ShardCache(url, tmp_path / "cache", budget_bytes=10**9)


def test_token_windows_overlap_by_one_token_and_stay_inside_their_shard():
    w = token_windows(np.arange(20), context=6)
    assert w.shape == (windows_in(20, 6), 7) == (3, 7)
    assert (w[1:, 0] == w[:-1, -1]).all()  # the next window's inputs begin at the targets' end
    assert w.max() == 18 and windows_in(6, 6) == 0 and windows_in(7, 6) == 1


def test_a_context_the_data_cannot_hold_is_named_in_one_line(tokens):
    manifest, _ = tokens
    with pytest.raises(DatasetError, match=r"\(train split\): context 81 is longer than the data"):
        check_context(manifest, 81)
    with pytest.raises(DatasetError, match="token data needs a context"):
        check_context(manifest, None)
    check_context(manifest, 80)
    assert split_layout(manifest, "train", 8).total == sum(
        windows_in(n, 8) for n in [81, 40, 5, 57, 64, 41]
    )


def _epoch_windows(manifest, cache, plans, steps, restart_at=None, prefetch=2):
    """Every rank's windows over `steps` steps, the plan switching through `plans`; with
    `restart_at`, each rank's reader is replaced by a fresh one at that step (a restart)."""
    seen = []
    for rank in range(3):
        reader = RankReader(manifest, "train", cache, rank, seed=3, prefetch=prefetch, context=8)
        for step in range(steps):
            if step == restart_at:
                reader.close()
                reader = RankReader(manifest, "train", cache, rank, 3, prefetch=prefetch, context=8)
            x, y = reader.batch(step, plans[step * len(plans) // steps])
            assert x.dtype == np.int64 and x.shape[1] == 9 and not y.any()
            assert (np.diff(x, axis=1) == 1).all()  # consecutive tokens of one shard
            seen.extend(x[:, 0].tolist())
        reader.close()
    return seen


@pytest.mark.parametrize("restart_at", [None, 5])
def test_token_windows_are_read_once_per_epoch_across_replans_and_restarts(tokens, restart_at):
    manifest, cache = tokens
    n = split_layout(manifest, "train", 8).total  # 33 windows: one epoch of 11 steps of 3
    plans = [[1, 1, 1], [2, 0, 1], [0, 1, 2]]
    first = _epoch_windows(manifest, cache, plans, 11, restart_at)
    starts = sorted(first)
    assert len(starts) == n == len(set(starts))
    two = _epoch_windows(manifest, cache, plans, 22, restart_at)
    assert sorted(two) == sorted(starts * 2)  # the second epoch: every window once again


def test_a_restarted_reader_hands_out_the_batches_the_first_would_have(tokens):
    manifest, cache = tokens
    plan = [2, 1, 0]
    one = RankReader(manifest, "train", cache, 0, seed=3, prefetch=2, context=8)
    two = RankReader(manifest, "train", cache, 0, seed=3, context=8)
    for step in range(14):
        x1, _ = one.batch(step, plan)
        if step >= 9:  # the restarted process reads from its checkpoint's step on
            assert np.array_equal(x1, two.batch(step, plan)[0])
    one.close()


def test_a_reader_holds_only_the_shards_of_its_step_and_its_prefetch(tmp_path):
    """A dataset of 40 shards, read with a cache budget of 4: in memory, at most the step's
    shards plus the prefetch depth; on disk, at most the budget plus the shards being written
    by the prefetch (an entry read meanwhile is not evicted: it is no longer least recent)."""
    url = f"memory://hetflow-stream/bounded-{tmp_path.name}"
    manifest = write_dataset(url, {"train": synthetic_source(1201, 1e-9, 0)["train"]}, 30)
    size = max(s.bytes for s in manifest.splits["train"].shards)
    cache = ShardCache(url, tmp_path / "c", budget_bytes=4 * size)
    most = 0
    with RankReader(manifest, "train", cache, 1, seed=0, prefetch=2) as reader:
        for step in range(60):
            reader.batch(step, [16, 24])
            held = len(reader.held) + len(reader._ahead)
            most = max(most, held - len(reader.needed(step, [16, 24])))
            assert cache.cached_bytes() <= (4 + 2) * size
    assert most <= 2 and reader.reads >= 40


def _sorted_labels_manifest(shards: int, per_shard: int, classes: int = 10) -> Manifest:
    """A tabular manifest (no data behind it) of `shards` shards of `per_shard` samples whose
    labels are sorted across the split: each class fills whole shards, the case where a step
    reads the most shards and every class walks its own blocks."""
    n = shards * per_shard
    bounds = np.linspace(0, n, classes + 1).astype(int)
    infos = []
    for i in range(shards):
        a, b = i * per_shard, (i + 1) * per_shard
        hist = {c: int(min(b, bounds[c + 1]) - max(a, bounds[c])) for c in range(classes)}
        labels = {c: k for c, k in hist.items() if k > 0}
        infos.append(
            ShardInfo(
                key=f"train/shard-{i:05d}.npz",
                samples=per_shard,
                bytes=1,
                sha256="0",
                labels=labels,
            )
        )
    split = SplitInfo(
        samples=n, labels={c: int(bounds[c + 1] - bounds[c]) for c in range(classes)}, shards=infos
    )
    return Manifest(
        url="memory://hetflow-stream/index", features=64, classes=classes, splits={"train": split}
    )


def _index_peak_bytes(manifest: Manifest, steps: list[int], batch: int = 512) -> int:
    """tracemalloc's peak while a reader numbers the split and plans `steps` (each step's
    samples and shards, and the prefetch's next shards), as `RankReader.batch` does."""
    import tracemalloc

    tracemalloc.start()
    try:
        reader = RankReader(manifest, "train", None, 0, seed=0)  # plans, reads nothing
        for step in steps:
            reader.needed(step, [batch])
            reader.upcoming(step, [batch], 4)
            reader.stream.index.shard_of(reader.stream.step_indices(step, [batch], 0))
        return tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


def test_the_sample_index_does_not_grow_with_the_number_of_samples():
    """A rank's index and epoch orders are O(shards x classes) plus the within-block
    permutations of the blocks in use (4 bytes per sample of a block's class): for 303,104
    samples (as in docs/measurements/data.md) under 1 MB, where a table per sample and an epoch's
    order cost 16 bytes a sample kept (4.8 MB) and 11.7 MB at the peak; ten times the samples in
    ten times the shards stay under 2 MB (112 MB before)."""
    _index_peak_bytes(_sorted_labels_manifest(8, 64), list(range(20)))  # imports, first calls
    small = _sorted_labels_manifest(148, 2048)
    n = small.splits["train"].samples
    steps = n // 512  # the first steps, and those across the end of the epoch
    assert _index_peak_bytes(small, [*range(100), *range(steps - 50, steps + 50)]) < 1e6
    large = _sorted_labels_manifest(1480, 2048)
    steps = 10 * n // 512
    assert _index_peak_bytes(large, [*range(50), *range(steps - 25, steps + 25)]) < 2e6


def test_image_shards_stream_as_uint8_images_each_once_per_epoch(tmp_path):
    """uint8 (N, C, H, W) images whose pixels are their ids, in 5 shards; 2 ranks, a re-plan."""
    url = f"memory://hetflow-stream/images-{tmp_path.name}"
    fs, root = filesystem(url)
    y = np.random.default_rng(2).integers(0, 3, size=100)
    shards = []
    for i in range(5):
        ids = np.arange(20 * i, 20 * i + 20)
        buf = io.BytesIO()
        np.savez(buf, x=np.tile(ids.astype(np.uint8)[:, None, None, None], (1, 1, 4, 4)), y=y[ids])
        data, key = buf.getvalue(), f"train/shard-{i:05d}.npz"
        fs.pipe_file(f"{root}/{key}", data)
        labels = {int(c): int((y[ids] == c).sum()) for c in np.unique(y[ids])}
        shards.append(
            ShardInfo(key=key, samples=20, bytes=len(data), sha256=sha256(data), labels=labels)
        )
    hist = {int(c): int((y == c).sum()) for c in np.unique(y)}
    manifest = ImageManifest(
        url=url,
        features=16,
        classes=3,
        splits={"train": SplitInfo(samples=100, labels=hist, shards=shards)},
    )
    cache = ShardCache(url, tmp_path / "c", budget_bytes=10**9)
    seen = []
    for rank in range(2):
        with RankReader(manifest, "train", cache, rank, seed=0, prefetch=2) as reader:
            for step in range(10):
                x, by = reader.batch(step, [6, 4] if step < 5 else [10, 0])
                assert x.dtype == np.uint8 and x.shape[1:] == (1, 4, 4)
                assert np.array_equal(by, y[x[:, 0, 0, 0]])
                seen.extend(x[:, 0, 0, 0].tolist())
    assert sorted(seen) == list(range(100))
