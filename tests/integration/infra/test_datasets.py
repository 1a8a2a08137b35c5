"""Datasets in S3 (moto over HTTP): ingest, bad input, killed ingests, reading a rank's share."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import numpy as np
import pytest

from hetflow.config import DatasetSpec
from hetflow.infra.data.cache import ShardCache
from hetflow.infra.data.format import (
    ChecksumError,
    DatasetError,
    MissingDataset,
    check_shards,
    encode_shard,
    filesystem,
    read_manifest,
    sha256,
    synthetic_source,
    verify_dataset,
    write_dataset,
)
from hetflow.infra.data.reader import RankReader, check_world, open_rank_data
from hetflow.infra.s3 import local_endpoint_environ
from hetflow.tasks.data import ingest_dataset

from tests.helpers.infra.datasets import _spec


def load_rank_data(spec: DatasetSpec):
    """Open the dataset and read every split through the cache, in bounded batches."""
    data = open_rank_data(spec)
    data.splits = {
        name: [np.concatenate(a) for a in zip(*data.eval_batches(name, batch=7), strict=True)]
        for name in data.manifest.splits
    }
    data.close()
    return data


def _class_by_class(x: np.ndarray, y: np.ndarray, shard: int) -> tuple[np.ndarray, np.ndarray]:
    """The samples in the reader's numbering: class by class within each shard."""
    order = np.concatenate(
        [a + np.argsort(y[a : a + shard], kind="stable") for a in range(0, len(y), shard)]
    )
    return x[order], y[order]


def _objects(url: str) -> list[str]:
    fs, root = filesystem(url)
    return sorted(p[len(root) + 1 :] for p in fs.find(root))


def _put(url: str, key: str, data: bytes) -> None:
    fs, root = filesystem(url)
    fs.pipe_file(f"{root}/{key}", data)


def test_ingest_writes_shards_and_manifest_and_reads_back(s3, tmp_path):
    spec = _spec(tmp_path)
    manifest = ingest_dataset.fn(spec)
    assert read_manifest(spec.url) == manifest
    assert manifest.ingest == {
        "source": "synthetic",
        "shard_samples": 32,
        "test_fraction": 0.2,
        "seed": 0,
        "samples": 100,
    }
    train = manifest.splits["train"]
    assert train.samples == 80 and len(train.shards) == 3 and manifest.classes == 10
    assert _objects(spec.url) == sorted(
        ["manifest.json", *(s.key for split in manifest.splits.values() for s in split.shards)]
    )
    verify_dataset(manifest, deep=True)

    source = synthetic_source(100, 0.2, 0)
    data = load_rank_data(spec)
    xtr, _ = _class_by_class(*source["train"], 32)
    _, yte = _class_by_class(*source["test"], 32)
    assert np.array_equal(data.splits["train"][0], xtr)
    assert np.array_equal(data.splits["test"][1], yte)
    assert data.cache.stats.misses == 4 and data.cache.stats.hits == 0
    assert data.cache.stats.s3_bytes_read == sum(
        s.bytes for sp in manifest.splits.values() for s in sp.shards
    )
    again = load_rank_data(spec)  # the same host's cache: nothing from S3
    assert again.cache.stats.hits == 4 and again.cache.stats.s3_bytes_read == 0


def test_an_existing_dataset_is_reused_only_if_it_is_the_same(s3, tmp_path, monkeypatch):
    spec = _spec(tmp_path)
    ingest_dataset.fn(spec)
    with monkeypatch.context() as mp:
        mp.setattr("hetflow.tasks.data.write_dataset", lambda *a, **k: pytest.fail("rewritten"))
        assert ingest_dataset.fn(spec).splits["train"].samples == 80
        with pytest.raises(
            DatasetError,
            match=r"^s3://hetflow-test-ds/syn: already holds a dataset "
            r"written with shard_samples=32, not 64",
        ):
            ingest_dataset.fn(_spec(tmp_path, shard_samples=64))
    assert (
        len(
            ingest_dataset.fn(_spec(tmp_path, shard_samples=64), overwrite=True)
            .splits["train"]
            .shards
        )
        == 2
    )
    # The 3 old train shards are gone, not left beside the 2 new ones.
    assert len([k for k in _objects(spec.url) if k.startswith("train/")]) == 2


def test_empty_datasets_are_refused_naming_the_url(s3):
    x = np.zeros((0, 64), np.float32)
    with pytest.raises(DatasetError, match=r"^s3://hetflow-test-ds/empty: split 'train' is empty$"):
        write_dataset("s3://hetflow-test-ds/empty", {"train": (x, np.zeros(0, int))}, 16)
    with pytest.raises(DatasetError, match="no splits"):
        write_dataset("s3://hetflow-test-ds/empty", {}, 16)
    with pytest.raises(DatasetError, match="split 'train' is empty"):  # 1 sample: all of it is test
        write_dataset("s3://hetflow-test-ds/empty", synthetic_source(1, 0.2, 0), 16)
    assert _objects("s3://hetflow-test-ds/empty") == []


def test_missing_bucket_prefix_or_manifest_are_named(s3, tmp_path):
    with pytest.raises(MissingDataset, match=r"^s3://no-such-bucket-hf: no such bucket"):
        read_manifest("s3://no-such-bucket-hf/data")
    write_dataset("s3://hetflow-test-ds/present", synthetic_source(40, 0.2, 0), 16)
    with pytest.raises(MissingDataset, match=r"^s3://hetflow-test-ds/absent: no dataset here"):
        read_manifest("s3://hetflow-test-ds/absent")
    _put("s3://hetflow-test-ds/orphans", "train/shard-00000.npz", b"x")
    with pytest.raises(MissingDataset, match=r"orphans/manifest.json: missing although 1 objects"):
        read_manifest("s3://hetflow-test-ds/orphans")
    with pytest.raises(DatasetError, match="no such bucket"):
        load_rank_data(_spec(tmp_path, url="s3://no-such-bucket-hf/data"))


def _manifest_json(url: str) -> dict:
    fs, root = filesystem(url)
    return json.loads(fs.cat_file(f"{root}/manifest.json"))


@pytest.mark.parametrize(
    "corrupt, message",
    [
        (lambda m: "{not json", "malformed manifest"),
        (lambda m: [1, 2], "expected a JSON object"),
        (
            lambda m: {**m, "splits": {"train": {**m["splits"]["train"], "samples": 999}}},
            "shards hold 32 samples, the split says 999",
        ),
        (
            lambda m: {
                **m,
                "splits": {
                    "train": {
                        **m["splits"]["train"],
                        "shards": [
                            {**m["splits"]["train"]["shards"][0], "key": "../../other/shard.npz"}
                        ],
                    }
                },
            },
            "must be a relative path inside the dataset",
        ),
        (lambda m: {**m, "classes": 1}, "outside 0..0"),
    ],
)
def test_malformed_manifests_are_named(s3, corrupt, message):
    url = "s3://hetflow-test-ds/malformed"
    write_dataset(url, {"train": synthetic_source(33, 0.01, 0)["train"]}, 32)
    bad = corrupt(_manifest_json(url))
    _put(url, "manifest.json", bad.encode() if isinstance(bad, str) else json.dumps(bad).encode())
    with pytest.raises(DatasetError, match=message) as e:
        read_manifest(url)
    assert str(e.value).startswith(f"{url}/manifest.json: malformed manifest (")
    assert "\n" not in str(e.value)


def test_shards_that_do_not_match_the_manifest_are_named(s3, tmp_path):
    spec = _spec(tmp_path, url="s3://hetflow-test-ds/mismatch")
    manifest = ingest_dataset.fn(spec)
    first, second = manifest.splits["train"].shards[:2]
    fs, root = filesystem(spec.url)

    # Same size, other content: the listing passes, the checksum at the source does not.
    original = fs.cat_file(f"{root}/{first.key}")
    _put(spec.url, first.key, original[:-1] + bytes([original[-1] ^ 1]))
    check_shards(manifest)
    with pytest.raises(ChecksumError, match=rf"^{spec.url}/{first.key}: checksum mismatch"):
        verify_dataset(manifest, deep=True)
    with pytest.raises(
        ChecksumError, match=rf"^{spec.url}/{first.key}: checksum mismatch at the source"
    ):
        load_rank_data(spec)

    _put(spec.url, first.key, original + b"tail")  # other size: the listing catches it
    with pytest.raises(ChecksumError, match=rf"^{spec.url}/{first.key}: {first.bytes + 4} bytes"):
        check_shards(manifest)
    fs.rm_file(f"{root}/{second.key}")
    _put(spec.url, first.key, original)
    with pytest.raises(
        DatasetError,
        match=rf"^{spec.url}/{second.key}: named in the manifest "
        r"\(split 'train'\) but missing",
    ):
        load_rank_data(spec)
    with pytest.raises(DatasetError, match=rf"{second.key}: named in the manifest"):
        ingest_dataset.fn(spec)


def test_a_shard_holding_other_samples_than_its_manifest_says_is_named(s3, tmp_path):
    """A manifest that is consistent in itself (sizes, SHA-256) but lies about a shard's samples."""
    url = "s3://hetflow-test-ds/lying"
    x, y = synthetic_source(65, 0.01, 0)["train"]
    write_dataset(url, {"train": (x, y)}, 32)
    m = _manifest_json(url)
    data = encode_shard(x[:31], y[:31])  # one sample short
    shard = m["splits"]["train"]["shards"][0]
    shard.update(bytes=len(data), sha256=sha256(data))
    _put(url, shard["key"], data)
    _put(url, "manifest.json", json.dumps(m).encode())
    manifest = read_manifest(url)
    check_shards(manifest)
    with pytest.raises(
        DatasetError,
        match=rf"^{url}/train/shard-00000.npz: holds 31 samples, "
        r"the manifest says 32$",
    ):
        load_rank_data(DatasetSpec(url=url, cache_dir=str(tmp_path / "c")))


KILLER = textwrap.dedent("""
    import os, signal, sys
    import hetflow.infra.data.format as d
    real = d.filesystem
    def patched(url):
        fs, root = real(url)
        put, n = fs.pipe_file, [0]
        def pipe_file(path, data, **kw):
            if n[0] == int(sys.argv[2]):
                os.kill(os.getpid(), signal.SIGKILL)  # no cleanup, no finally: killed
            n[0] += 1
            return put(path, data, **kw)
        fs.pipe_file = pipe_file
        return fs, root
    d.filesystem = patched
    d.write_dataset(sys.argv[1], d.synthetic_source(100, 0.2, 1), int(sys.argv[3]))
""")


def _killed_ingest(url: str, after: int, shard_samples: int) -> None:
    proc = subprocess.run(
        [sys.executable, "-c", KILLER, url, str(after), str(shard_samples)],
        capture_output=True,
        timeout=120,
        check=False,
    )
    assert proc.returncode == -9, proc.stderr.decode()[-2000:]


def test_an_ingest_failing_midway_leaves_no_manifest(s3, tmp_path, monkeypatch):
    spec = _spec(tmp_path, url="s3://hetflow-test-ds/failing", shard_samples=16)
    fs, _ = filesystem(spec.url)
    put, calls = fs.pipe_file, []

    def pipe_file(path, data, **kw):
        if len(calls) == 2:
            raise ConnectionResetError(f"{path}: connection reset")
        calls.append(path)
        return put(path, data, **kw)

    with monkeypatch.context() as mp:
        mp.setattr(fs, "pipe_file", pipe_file)
        with pytest.raises(ConnectionResetError):
            ingest_dataset.fn(spec)
    assert _objects(spec.url) == ["train/shard-00000.npz", "train/shard-00001.npz"]
    with pytest.raises(MissingDataset, match="manifest.json: missing although 2 objects"):
        read_manifest(spec.url)
    # Ingest again (what the task's retry or a re-run does): a whole dataset.
    verify_dataset(ingest_dataset.fn(spec), deep=True)


def test_a_killed_ingest_over_a_dataset_leaves_no_manifest_pointing_at_other_shards(s3, tmp_path):
    """SIGKILL while a dataset is replaced by one with other shards: the old manifest went
    before the first shard was replaced, so no reader pairs it with the new shards."""
    spec = _spec(tmp_path, url="s3://hetflow-test-ds/killed")
    ingest_dataset.fn(spec)
    _killed_ingest(spec.url, after=2, shard_samples=16)  # killed writing the 3rd shard
    with pytest.raises(MissingDataset, match="missing although"):
        read_manifest(spec.url)
    assert ingest_dataset.fn(spec).splits["train"].samples == 80


def test_more_ranks_than_samples_is_named(s3):
    url = "s3://hetflow-test-ds/tiny"
    manifest = write_dataset(url, {"train": synthetic_source(4, 0.01, 0)["train"]}, 2)
    with pytest.raises(DatasetError, match=rf"^{url} \(train split\): 4 ranks but only 3 samples"):
        check_world(manifest, [1, 1, 1, 1])
    check_world(manifest, [1, 1, 1])


@pytest.fixture(scope="module")
def ids_dataset(s3_server):
    """120 samples whose features are their ids, in 6 shards (moto over HTTP), written once."""
    url = "s3://hetflow-test-ds/ids"
    rng = np.random.default_rng(5)
    y = rng.integers(0, 4, size=120)
    x = np.tile(np.arange(120, dtype=np.float32)[:, None], (1, 3))  # feature = sample id
    with local_endpoint_environ(s3_server):
        return write_dataset(url, {"train": (x, y)}, 20), y


@pytest.mark.parametrize("prefetch, budget_shards", [(0, 100), (3, 100), (2, 3)])
def test_rank_readers_hand_out_each_sample_once_per_epoch(
    s3, ids_dataset, tmp_path, prefetch, budget_shards
):
    """All ranks' batches over an epoch, with the plan changing mid-epoch: every sample once,
    with its own features and label, whatever the cache budget and prefetch depth. The ranks
    share one host's cache."""
    manifest, y = ids_dataset
    n = len(y)
    size = max(s.bytes for s in manifest.splits["train"].shards)
    plans = [[8, 8, 8], [4, 12, 8], [20, 2, 2]]
    steps = n // 24
    seen = []
    cache = ShardCache(manifest.url, tmp_path / "c", budget_shards * size)
    for rank in range(3):
        with RankReader(manifest, "train", cache, rank, seed=1, prefetch=prefetch) as reader:
            for step in range(steps):
                bx, by = reader.batch(step, plans[step * len(plans) // steps])
                ids = bx[:, 0].astype(int)
                assert np.array_equal(by, y[ids]) and (bx == bx[:, :1]).all()
                seen.extend(ids)
    assert sorted(seen) == list(range(n))
    assert cache.cached_bytes() <= budget_shards * size
    assert cache.stats.hits + cache.stats.misses >= 6


def test_an_object_another_writer_puts_is_seen_at_once(s3):
    """The shared client keeps no listing: after a listing, another process's manifest shows."""
    import boto3

    url = "s3://hetflow-test-other/ds"
    fs, root = filesystem(url)
    fs.mkdir("hetflow-test-other")
    fs.pipe_file(f"{root}/train/shard-00000.npz", b"x")
    assert not fs.exists(f"{root}/manifest.json") and fs.find(root)  # a listing is made
    boto3.client("s3").put_object(Bucket="hetflow-test-other", Key="ds/manifest.json", Body=b"{}")
    assert filesystem(url)[0].exists(f"{root}/manifest.json")
