"""Every ingest source `hetflow data ingest --source` offers, written by the command's own path
(its flags, `ingest_of`, the source check, the prepare-dataset flow) to a local folder that
does not exist yet and to `s3://` (moto over HTTP); then the comparison end to end on one of
each: the Parquet example of docs/data.md in a folder, with nothing configured (its profile
history kept in the local store), and an image folder in S3. Small: 2 workers, 4 steps."""

from __future__ import annotations

import argparse

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from PIL import Image

from hetflow.cli import build_parser
from hetflow.cli.checks import check_ingest_source
from hetflow.cli.job import ingest_of
from hetflow.config import ClusterSpec, DatasetSpec, TrainConfig
from hetflow.infra.data.format import check_shards, read_manifest

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]

KIND = {
    "digits": "tabular",
    "synthetic": "tabular",
    "stdlib": "tokens",
    "text": "tokens",
    "parquet": "tabular",
    "images": "images",
}


def ingest_sources() -> list[str]:
    """The choices of `hetflow data ingest --source`, as the parser offers them."""
    parser = build_parser()
    data = _subcommand(parser, "data")
    ingest = _subcommand(data, "ingest")
    return next(a.choices for a in ingest._actions if a.dest == "source")


def _subcommand(parser: argparse.ArgumentParser, name: str) -> argparse.ArgumentParser:
    subparsers = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return subparsers.choices[name]


def _inputs(root) -> dict[str, list[str]]:
    """Each source's flags (beyond --source and --to), over small inputs made under `root`."""
    rng = np.random.default_rng(0)
    (root / "corpus").mkdir()
    for i in range(3):
        text = bytes(rng.integers(32, 127, size=6000, dtype=np.uint8))
        (root / "corpus" / f"doc{i}.txt").write_bytes(text)
    (root / "tables").mkdir()
    x = rng.normal(size=(600, 5))
    y = (x[:, 0] > 0).astype(np.int64) + (x[:, 1] > 1)
    columns = {f"f{i}": x[:, i] for i in range(5)}
    pq.write_table(pa.table({**columns, "label": y}), root / "tables" / "part-0.parquet")
    for c in ("cat", "dog"):
        (root / "photos" / c).mkdir(parents=True)
        for i in range(12):
            pixels = rng.integers(0, 255, size=(10, 12, 3), dtype=np.uint8)
            Image.fromarray(pixels).save(root / "photos" / c / f"{i}.png")
    return {
        "digits": [],
        "synthetic": ["--samples", "600"],
        "stdlib": ["--max-mb", "0.1"],
        "text": ["--from", str(root / "corpus"), "--glob", "**/*.txt"],
        "parquet": [
            *("--from", str(root / "tables")),
            *("--columns", "f0,f1,f2,f3,f4", "--label-column", "label"),
        ],
        "images": ["--from", str(root / "photos"), "--image-size", "8", "--shard-samples", "8"],
    }


def _ingest(source: str, flags: list[str], url: str) -> dict:
    """`hetflow data ingest --source SOURCE FLAGS --to URL`, the command's path in-process."""
    from hetflow.flows.prepare_dataset import prepare_dataset

    args = build_parser().parse_args(["data", "ingest", "--source", source, *flags, "--to", url])
    spec = ingest_of(args)
    check_ingest_source(spec)
    return prepare_dataset(dataset=spec, overwrite=True)


def _compare(url: str, recipe: str, cache, **options) -> dict:
    from hetflow.flows.compare import compare

    return compare(
        cluster=ClusterSpec.from_speeds([1, 2]),
        dataset=DatasetSpec(url=url, source="existing", cache_dir=str(cache)),
        train=TrainConfig(recipe=recipe, recipe_options=options, steps=4, global_batch=32),
    )


def _ran(result: dict) -> None:
    """Both variants trained on the data, each its own MLflow run."""
    assert set(result["run_ids"]) == {"baseline", "optimized"}
    for variant in ("baseline", "optimized"):
        assert 0.0 <= result["table"][variant]["final_accuracy"] <= 1.0


def test_every_source_to_a_folder_and_to_s3_then_a_comparison_on_each(
    s3, prefect_harness, hetflow_home, tmp_path, monkeypatch
):
    sources = ingest_sources()
    assert set(sources) == set(KIND)  # a new source gets a row here
    flags = _inputs(tmp_path)
    with monkeypatch.context() as m:  # nothing configured: the run's own endpoint and store
        for name in ("AWS_ENDPOINT_URL", "AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"):
            m.delenv(name, raising=False)
        for source in sources:
            folder = tmp_path / "mine" / source  # neither it nor "mine" exists yet
            manifest = _ingest(source, flags[source], folder.as_uri())
            assert manifest["kind"] == KIND[source], source
            assert (folder / "manifest.json").is_file()
            assert sorted(p.name for p in folder.iterdir()) == ["manifest.json", "test", "train"]
            check_shards(read_manifest(folder.as_uri()))
        local = _compare((tmp_path / "mine" / "parquet").as_uri(), "digits-mlp", tmp_path / "c1")
        _ran(local)
        # the history of a dataset outside S3: in the local store, not under the filesystem root
        history = hetflow_home / "s3" / "hetflow-data" / "profiles" / "types"
        assert len(list(history.glob("speed-*/*.json"))) == 2

    for source in sources:  # the moto endpoint over HTTP, as AWS_ENDPOINT_URL
        url = f"s3://hetflow-sources/{source}"
        assert _ingest(source, flags[source], url)["kind"] == KIND[source], source
        check_shards(read_manifest(url))
    remote = _compare("s3://hetflow-sources/images", "resnet", tmp_path / "c2", width=4, blocks=1)
    _ran(remote)
