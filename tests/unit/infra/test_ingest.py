"""Ingest of the user's data as they have it: text, Parquet and image folders, local or in S3
(moto over HTTP), streamed into shards + manifest with bounded memory; bad sources refused."""

from __future__ import annotations

import tracemalloc

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from PIL import Image

from hetflow.config import DatasetSpec
from hetflow.infra.data.format import DatasetError, MissingDataset, check_shards, read_manifest
from hetflow.infra.data.reader import open_rank_data

from tests.helpers.infra.ingest import _ingest


def _text_corpus(root, files: int, size: int) -> bytes:
    rng = np.random.default_rng(0)
    everything = b""
    for i in range(files):
        data = bytes(rng.integers(32, 127, size=size, dtype=np.uint8))
        (root / f"doc{i:03d}.txt").write_bytes(data)
        everything += data
    (root / "notes.md").write_text("not matched by the glob")
    return everything


def test_a_text_folder_becomes_token_shards_that_train_as_windows(tmp_path):
    (tmp_path / "src").mkdir()
    corpus = _text_corpus(tmp_path / "src", files=3, size=5000)
    url = f"file://{tmp_path}/ds"
    m = _ingest(source="text", source_url=str(tmp_path / "src"), glob="*.txt", url=url)
    assert m.kind == "tokens" and m.vocab == 256 and m.dtype == "uint8"
    assert sum(s.tokens for split in m.splits.values() for s in split.shards) == len(corpus)
    assert 0.15 < m.splits["test"].samples / len(corpus) < 0.25  # test_fraction 0.2
    check_shards(m)
    data = open_rank_data(DatasetSpec(url=url, cache_dir=str(tmp_path / "c")), context=16)
    x, _ = data.reader(0, seed=0).batch(0, [4, 4])
    data.close()
    assert x.shape == (4, 17) and bytes(x[0].astype(np.uint8)) in corpus


def test_parquet_columns_become_tabular_shards_and_a_missing_column_is_named(tmp_path):
    (tmp_path / "pq").mkdir()
    rng = np.random.default_rng(1)
    for i in range(2):
        table = pa.table(
            {
                "a": rng.random(300),
                "b": rng.random(300),
                "y": rng.integers(0, 3, 300),
                "z": ["s"] * 300,
            }
        )
        pq.write_table(table, tmp_path / "pq" / f"part-{i}.parquet")
    url = f"file://{tmp_path}/tab"
    kw = dict(source="parquet", source_url=str(tmp_path / "pq"), url=url, shard_samples=128)
    m = _ingest(columns=["a", "b"], label_column="y", **kw)
    assert m.kind == "tabular" and m.features == 2 and m.classes == 3
    assert m.splits["train"].samples + m.splits["test"].samples == 600
    with pytest.raises(DatasetError, match=r"part-0.parquet: no column 'c'"):
        _ingest(columns=["a", "c"], label_column="y", **{**kw, "url": f"file://{tmp_path}/t2"})
    with pytest.raises(MissingDataset):  # refused before anything was written
        read_manifest(f"file://{tmp_path}/t2")


def _image_folder(root, classes=("cat", "dog"), per_class=6) -> None:
    rng = np.random.default_rng(2)
    for c in classes:
        (root / c).mkdir(parents=True)
        for i in range(per_class):
            pixels = rng.integers(0, 255, size=(10, 12, 3), dtype=np.uint8)
            Image.fromarray(pixels).save(root / c / f"{i}.png")


def test_an_image_folder_becomes_uint8_image_shards_labelled_by_subfolder(tmp_path):
    _image_folder(tmp_path / "img")
    url = f"file://{tmp_path}/imgs"
    m = _ingest(source="images", source_url=str(tmp_path / "img"), url=url, image_size=8)
    assert m.kind == "images" and m.shape == [3, 8, 8] and m.classes == 2
    assert m.splits["train"].labels == {0: 5, 1: 5} and m.splits["test"].labels == {0: 1, 1: 1}
    data = open_rank_data(DatasetSpec(url=url, cache_dir=str(tmp_path / "c")))
    x, y = data.reader(0, seed=0).batch(0, [2, 2])
    data.close()
    assert x.shape == (2, 3, 8, 8) and x.dtype == np.uint8 and set(y) <= {0, 1}


def test_a_killed_or_failed_ingest_leaves_no_manifest_naming_missing_shards(tmp_path):
    _image_folder(tmp_path / "img")
    (tmp_path / "img" / "dog" / "9.png").write_bytes(b"not a png")  # fails mid-way
    url = f"file://{tmp_path}/imgs"
    with pytest.raises(DatasetError, match=r"dog/9.png: not an image"):
        _ingest(source="images", source_url=str(tmp_path / "img"), url=url, shard_samples=2)
    with pytest.raises(MissingDataset):
        read_manifest(url)


@pytest.mark.parametrize(
    "kw, message",
    [
        ({"source": "text", "source_url": "/no/such/folder"}, "does not exist"),
        ({"source": "text", "glob": "*.nothing"}, "no files match"),
        ({"source": "images"}, "no images in class subfolders"),
        ({"source": "parquet", "columns": ["a"], "label_column": "y"}, "no files match"),
    ],
)
def test_a_bad_source_is_refused_in_one_line_before_anything_is_written(tmp_path, kw, message):
    (tmp_path / "empty").mkdir()
    (tmp_path / "empty" / "readme.txt").write_text("x")
    kw = {"source_url": str(tmp_path / "empty"), **kw}
    with pytest.raises(DatasetError, match=message) as e:
        _ingest(url=f"file://{tmp_path}/out", **kw)
    assert "\n" not in str(e.value)
    with pytest.raises(MissingDataset):
        read_manifest(f"file://{tmp_path}/out")


def test_ingest_memory_stays_bounded_on_a_corpus_many_shards_large(tmp_path, monkeypatch):
    monkeypatch.setattr("hetflow.infra.data.ingest.TOKEN_SHARD_BYTES", 1 << 18)
    monkeypatch.setattr("hetflow.infra.data.ingest.PIECE_BYTES", 1 << 18)
    (tmp_path / "big").mkdir()
    _text_corpus(tmp_path / "big", files=12, size=1_500_000)  # 18 MB: 69 shards of 256 KiB
    tracemalloc.start()
    try:
        _ingest(
            source="text",
            source_url=str(tmp_path / "big"),
            glob="*.txt",
            url=f"file://{tmp_path}/o",
        )
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    print(f"peak traced memory {peak / 1e6:.1f} MB for an 18 MB corpus")
    assert peak < 12 * (1 << 18), peak  # a few shards and pieces in flight, not the corpus


@pytest.mark.parametrize(
    "argv, source, url",
    [
        (["demo"], "digits", "s3://hetflow-data/digits"),
        (["demo", "--recipe", "gpt"], "stdlib", "s3://hetflow-data/stdlib"),
        (["train", "--dataset-url", "s3://mine/corpus"], "existing", "s3://mine/corpus"),
    ],
)
def test_a_job_trains_on_the_recipe_dataset_or_the_one_ingested_at_its_url(argv, source, url):
    from hetflow.cli import build_parser
    from hetflow.cli.job import dataset_of

    spec = dataset_of(build_parser().parse_args(argv))
    assert (spec.source, spec.url) == (source, url)


def test_the_benchmarks_write_text_for_a_token_recipe_and_refuse_images():
    from hetflow.config import ConfigError, TrainConfig

    from benchmarks import BENCH_TEXT_MB, check_bench_recipe

    assert check_bench_recipe(TrainConfig(recipe="gpt")) == BENCH_TEXT_MB
    assert check_bench_recipe(TrainConfig(recipe="digits-cnn")) is None
    with pytest.raises(ConfigError, match="train.recipe: resnet reads images"):
        check_bench_recipe(TrainConfig(recipe="resnet"))
