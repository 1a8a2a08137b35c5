"""The user's data, as they have it, written as shards + manifest while it is read.

Sources (a local folder, `file://` or `s3://` prefix; read through fsspec, one file at a time):

- `text`: files under a folder matching a glob, as byte-level tokens (`uint8`, vocab 256), in
  `.npy` token shards (nanoGPT's format), the last `test_fraction` of every piece held out;
  `stdlib`: the Python standard library's `.py` files (found from `sysconfig`), a corpus every
  machine with Python has;
- `parquet`: Parquet files, the named feature columns (floats) and label column (integers),
  read in record batches (pyarrow) into tabular `.npz` shards;
- `images`: a folder with one subfolder per class, each image resized to a square of
  `image_size` pixels, RGB, into images `.npz` shards (uint8 N x 3 x H x W).

Memory stays bounded whatever the input: one file (or one Parquet batch) and one shard per
split are held at a time. The test split takes the tail of every text piece, or every k-th
sample (rows, images), so a split never depends on the input's total size. Writing keeps
the ordering of `infra.datasets.write_dataset`: the old manifest is deleted first, the new one
written after the last shard, stale shards removed after that, so a killed ingest leaves no
manifest naming a missing shard.

    >>> test_every(0.2), test_every(0.5)
    (5, 2)
"""

from __future__ import annotations

import contextlib
import io
import sysconfig
from collections.abc import Iterator
from pathlib import Path

import numpy as np

from hetflow.config import DatasetSpec
from hetflow.infra.data.format import (
    MANIFEST,
    DatasetError,
    Manifest,
    ShardInfo,
    SplitInfo,
    _histogram,
    _remove_stale_shards,
    encode_shard,
    sha256,
)
from hetflow.infra.s3 import ensure_bucket, filesystem

STREAMED_SOURCES = ("text", "stdlib", "parquet", "images")
TOKEN_SHARD_BYTES = 1 << 20  # tokens per text shard (1 MiB of uint8)
PIECE_BYTES = 1 << 20  # text read at a time
IMAGE_SUFFIXES = (".png", ".jpg", ".jpeg", ".bmp", ".gif", ".webp")


def test_every(test_fraction: float) -> int:
    """Every k-th file or sample goes to the test split, k = round(1 / test_fraction)."""
    return max(2, round(1 / test_fraction))


def _as_url(path: str) -> str:
    return path if "://" in path else f"file://{Path(path).resolve()}"


def _files(spec: DatasetSpec, pattern: str, what: str = "") -> tuple[object, list[str]]:
    """The source's filesystem and its files matching `pattern`, sorted; one line naming the
    source when it does not exist or holds no such file."""
    if spec.source == "stdlib":
        root = sysconfig.get_paths()["stdlib"]
        fs, base = filesystem(f"file://{root}")
    else:
        if not spec.source_url:
            raise DatasetError(f"dataset.source_url: source {spec.source!r} needs a path or URL")
        fs, base = filesystem(_as_url(spec.source_url))
    if not fs.exists(base):
        raise DatasetError(f"{spec.source_url or base}: the ingest source does not exist")
    found = sorted(p for p in fs.glob(f"{base.rstrip('/')}/{pattern}") if fs.isfile(p))
    if not found:
        wanted = what or f"no files match {pattern!r}"
        raise DatasetError(f"{spec.source_url or base}: {wanted} to ingest")
    return fs, found


class _SplitWriter:
    """Shards of one split, written as they fill (`add`), listed in a `SplitInfo` (`close`)."""

    def __init__(self, fs, root: str, split: str, kind: str, per_shard: int) -> None:
        self.fs, self.root, self.split, self.kind, self.per_shard = fs, root, split, kind, per_shard
        self.parts: list[np.ndarray] = []
        self.labels: list[np.ndarray] = []
        self.held = 0
        self.shards: list[ShardInfo] = []

    def add(self, x: np.ndarray, y: np.ndarray | None = None) -> None:
        while len(x):
            take = min(len(x), self.per_shard - self.held)
            self.parts.append(x[:take].copy())  # not a view holding the whole piece
            if y is not None:
                self.labels.append(y[:take])
                y = y[take:]
            x, self.held = x[take:], self.held + take
            if self.held == self.per_shard:
                self.flush()

    def flush(self) -> None:
        if not self.held:
            return
        x = np.concatenate(self.parts)
        i = len(self.shards)
        if self.kind == "tokens":
            buf = io.BytesIO()
            np.save(buf, x.astype(np.uint8), allow_pickle=False)
            data, key = buf.getvalue(), f"{self.split}/shard-{i:05d}.npy"
            info = dict(samples=len(x), labels={0: len(x)}, tokens=len(x))
        else:
            y = np.concatenate(self.labels)
            data, key = encode_shard(x, y), f"{self.split}/shard-{i:05d}.npz"
            info = dict(samples=len(x), labels=_histogram(y))
        self.fs.pipe_file(f"{self.root}/{key}", data)
        self.shards.append(ShardInfo(key=key, bytes=len(data), sha256=sha256(data), **info))
        self.parts, self.labels, self.held = [], [], 0

    def close(self) -> SplitInfo:
        self.flush()
        if not self.shards:
            raise DatasetError(f"the ingest source gave the {self.split} split no samples")
        hist: dict[int, int] = {}
        for s in self.shards:
            for c, n in s.labels.items():
                hist[c] = hist.get(c, 0) + n
        return SplitInfo(
            samples=sum(s.samples for s in self.shards), labels=hist, shards=self.shards
        )


def _text_chunks(spec: DatasetSpec) -> Iterator[tuple[bool, np.ndarray]]:
    """(is_test, bytes as uint8) in pieces of at most a MiB, file by file, up to `max_mb` in
    all; the last `test_fraction` of every piece is the test split's."""
    fs, files = _files(spec, spec.glob if spec.source == "text" else "**/*.py")
    budget = int(spec.max_mb * 1e6) if spec.max_mb else None
    for path in files:
        with fs.open(path, "rb") as f:
            while budget is None or budget > 0:
                data = f.read(min(PIECE_BYTES, budget) if budget is not None else PIECE_BYTES)
                if not data:
                    break
                if budget is not None:
                    budget -= len(data)
                piece = np.frombuffer(data, dtype=np.uint8)
                cut = int(len(piece) * (1 - spec.test_fraction))
                yield False, piece[:cut]
                yield True, piece[cut:]
        if budget is not None and budget <= 0:
            return


def _parquet_chunks(spec: DatasetSpec) -> Iterator[tuple[np.ndarray, np.ndarray]]:
    """(x float32, y int64) per Parquet record batch, over the source's files."""
    import pyarrow.parquet as pq

    fs, files = _files(spec, spec.glob if spec.glob != "**/*" else "**/*.parquet")
    if not spec.columns or not spec.label_column:
        raise DatasetError("dataset.columns: a Parquet source needs its feature and label columns")
    wanted = [*spec.columns, spec.label_column]
    for path in files:
        with fs.open(path, "rb") as f:
            pf = pq.ParquetFile(f)
            missing = [c for c in wanted if c not in pf.schema_arrow.names]
            if missing:
                raise DatasetError(
                    f"{path}: no column {missing[0]!r} (has {pf.schema_arrow.names})"
                )
            for batch in pf.iter_batches(batch_size=4096, columns=wanted):
                cols = [batch.column(c).to_numpy(zero_copy_only=False) for c in spec.columns]
                x = np.stack(cols, axis=1).astype(np.float32)
                y = batch.column(spec.label_column).to_numpy(zero_copy_only=False)
                yield x, y.astype(np.int64)


def _image_chunks(spec: DatasetSpec) -> Iterator[tuple[np.ndarray, np.ndarray]]:
    """(x uint8 1 x 3 x S x S, y) per image; classes are the sorted subfolder names."""
    from PIL import Image

    fs, files = _files(spec, "*/*", "no images in class subfolders (CLASS/IMAGE.png)")
    images = [p for p in files if p.lower().endswith(IMAGE_SUFFIXES)]
    classes = sorted({p.rsplit("/", 2)[-2] for p in images})
    if not images:
        raise DatasetError(f"{spec.source_url}: no images in class subfolders (CLASS/IMAGE.png)")
    size = spec.image_size
    for path in images:
        try:
            with fs.open(path, "rb") as f:
                img = Image.open(f).convert("RGB").resize((size, size))
        except (OSError, ValueError) as e:
            raise DatasetError(f"{path}: not an image PIL can read ({type(e).__name__})") from None
        x = np.asarray(img, dtype=np.uint8).transpose(2, 0, 1)[None]
        yield x, np.asarray([classes.index(path.rsplit("/", 2)[-2])], dtype=np.int64)


def check_source(spec: DatasetSpec) -> None:
    """`spec`'s source (one of STREAMED_SOURCES) can be read, up to its first chunk (a Parquet
    batch, an image, a MiB of text), without writing anything: a one-line DatasetError naming
    it otherwise (no such folder, no files to ingest, a column the files lack, no class
    subfolders, an image PIL cannot read)."""
    chunks = {"parquet": _parquet_chunks, "images": _image_chunks}.get(spec.source, _text_chunks)
    first = chunks(spec)
    try:
        next(first, None)
    finally:
        first.close()  # the file it holds open


def ingest_streamed(spec: DatasetSpec, ingest: dict) -> Manifest:
    """Write `spec`'s source (one of STREAMED_SOURCES) to `spec.url` as shards + manifest."""
    url = spec.url.rstrip("/")
    fs, root = filesystem(url)
    try:
        ensure_bucket(url)
    except OSError as e:
        raise DatasetError(f"{url}: cannot create or reach the bucket ({e})") from None
    kind = {"text": "tokens", "stdlib": "tokens", "parquet": "tabular"}.get(spec.source, "images")
    per_shard = TOKEN_SHARD_BYTES if kind == "tokens" else spec.shard_samples
    chunks = {"parquet": _parquet_chunks, "images": _image_chunks}.get(spec.source)
    check_source(spec)  # bad input before anything is deleted
    with contextlib.suppress(FileNotFoundError):
        fs.rm_file(f"{root}/{MANIFEST}")
    writers = {s: _SplitWriter(fs, root, s, kind, per_shard) for s in ("train", "test")}
    every, seen, shape = test_every(spec.test_fraction), 0, None
    if chunks is None:
        for is_test, tokens in _text_chunks(spec):
            writers["test" if is_test else "train"].add(tokens)
    else:
        for x, y in chunks(spec):
            shape = list(x.shape[1:])
            test = (np.arange(seen, seen + len(x)) % every) == every - 1
            writers["test"].add(x[test], y[test])
            writers["train"].add(x[~test], y[~test])
            seen += len(x)
    splits = {name: w.close() for name, w in writers.items()}
    classes = max(max(s.labels) for s in splits.values()) + 1
    manifest = Manifest(
        url=url,
        format="npy" if kind == "tokens" else "npz",
        kind=kind,
        features=shape[0] if kind == "tabular" else 0,
        classes=classes,
        shape=shape if kind == "images" else None,
        vocab=256 if kind == "tokens" else None,
        dtype="uint8" if kind == "tokens" else None,
        splits=splits,
        ingest=ingest,
    )
    fs.pipe_file(f"{root}/{MANIFEST}", manifest.model_dump_json(indent=1).encode())
    _remove_stale_shards(fs, root, manifest)
    return manifest
