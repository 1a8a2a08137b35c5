"""Datasets as NumPy `.npz` shards plus a JSON manifest, under any fsspec URL (S3 first).

Layout under the dataset URL::

    manifest.json                      written last: a reader never sees shards that are missing
    train/shard-00000.npz              arrays `x` (float32, N x 64) and `y` (int64, N)
    test/shard-00000.npz

The manifest lists, per split, each shard's key, sample count, label histogram, byte size and
SHA-256, so that a reader can check what it fetched. Transfers go through fsspec (s3fs); what is
written here is only the layout, the checks and the ordering that makes an ingest safe to kill:
an old manifest is deleted before the first shard is replaced, the new one is written after the
last shard, and only then are shards that no manifest names any more removed.

Every error names the object it is about (`s3://bucket/prefix/train/shard-00003.npz: ...`).
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import json
import re
from typing import Literal

import numpy as np
from pydantic import BaseModel, ValidationError, field_validator, model_validator

from hetflow.infra.s3 import ensure_bucket, filesystem

MANIFEST = "manifest.json"
_SHARD_KEY = re.compile(r"^[A-Za-z0-9_.-]+/shard-\d+\.(npz|npy)$")
KINDS = ("tabular", "images", "tokens")


class DatasetError(ValueError):
    """A dataset that is missing, malformed, or does not match its manifest (names the object)."""


class MissingDataset(DatasetError):
    """No manifest at the URL (nothing ingested there, or an ingest that did not finish)."""


class ChecksumError(DatasetError):
    """Bytes at the source do not match the manifest's size or SHA-256 (names the object)."""


class ShardInfo(BaseModel):
    """One shard. A token shard (`.npy`, 1-D) counts its tokens as `samples` and `tokens`, all
    of label 0 (`labels = {0: tokens}`): the reader cuts it into windows of its context."""

    key: str
    samples: int
    bytes: int
    sha256: str
    labels: dict[int, int]
    tokens: int | None = None

    @field_validator("key")
    @classmethod
    def _relative(cls, v: str) -> str:
        # A manifest must not send a reader outside the dataset's prefix.
        if v.startswith("/") or "\\" in v or any(p in ("", ".", "..") for p in v.split("/")):
            raise ValueError(f"shard key {v!r} must be a relative path inside the dataset")
        return v

    @model_validator(mode="after")
    def _counts(self) -> ShardInfo:
        if self.samples < 1 or self.bytes < 1:
            raise ValueError(f"{self.key}: a shard needs at least one sample and one byte")
        if sum(self.labels.values()) != self.samples:
            raise ValueError(
                f"{self.key}: label histogram sums to {sum(self.labels.values())}, "
                f"not to its {self.samples} samples"
            )
        return self


class SplitInfo(BaseModel):
    samples: int
    labels: dict[int, int]
    shards: list[ShardInfo]

    @model_validator(mode="after")
    def _consistent(self) -> SplitInfo:
        if not self.shards:
            raise ValueError("a split needs at least one shard")
        total = sum(s.samples for s in self.shards)
        if total != self.samples:
            raise ValueError(f"its shards hold {total} samples, the split says {self.samples}")
        hist: dict[int, int] = {}
        for s in self.shards:
            for c, n in s.labels.items():
                hist[c] = hist.get(c, 0) + n
        if {c: n for c, n in hist.items() if n} != {c: n for c, n in self.labels.items() if n}:
            raise ValueError("the shards' label histograms do not add up to the split's")
        return self


class Manifest(BaseModel):
    """A dataset: `kind` 'tabular' (npz: x float32 N x `features`, y int64), 'images' (npz: x
    uint8 N x C x H x W, `shape` [C, H, W], y int64) or 'tokens' (`.npy` 1-D arrays of token
    ids below `vocab`, of `dtype`; `features` 0, `classes` 1). Manifests written before kinds
    existed read as tabular."""

    url: str
    format: str = "npz"
    kind: Literal["tabular", "images", "tokens"] = "tabular"
    features: int
    classes: int
    shape: list[int] | None = None
    vocab: int | None = None
    dtype: str | None = None
    splits: dict[str, SplitInfo]
    ingest: dict = {}  # the parameters the dataset was written with (source, samples, ...)

    @model_validator(mode="after")
    def _labels(self) -> Manifest:
        for name, split in self.splits.items():
            bad = [c for c in split.labels if not 0 <= c < self.classes]
            if bad:
                raise ValueError(
                    f"split {name!r} has label {bad[0]}, outside 0..{self.classes - 1}"
                )
        return self

    def shard_url(self, shard: ShardInfo) -> str:
        return f"{self.url}/{shard.key}"


def sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def encode_shard(x: np.ndarray, y: np.ndarray) -> bytes:
    buf = io.BytesIO()
    # tabular rows as float32; images (N x C x H x W) keep their uint8 pixels
    np.savez(buf, x=x.astype(np.float32 if x.ndim == 2 else np.uint8), y=y.astype(np.int64))
    return buf.getvalue()


def decode_shard(data: bytes, name: str) -> tuple[np.ndarray, np.ndarray]:
    try:
        with np.load(io.BytesIO(data)) as z:
            x, y = z["x"], z["y"]
    except Exception as e:  # zipfile/pickle/KeyError: any of them means a bad shard
        raise DatasetError(f"{name}: not a valid npz shard ({type(e).__name__})") from None
    if x.ndim not in (2, 4) or y.ndim != 1 or len(x) != len(y):
        raise DatasetError(f"{name}: arrays of shapes {x.shape} and {y.shape} do not pair up")
    return x, y


def check_shard(shard: ShardInfo, x: np.ndarray, y: np.ndarray, name: str) -> None:
    """A decoded shard holds what the manifest says (sample count and label histogram)."""
    if len(x) != shard.samples:
        raise DatasetError(f"{name}: holds {len(x)} samples, the manifest says {shard.samples}")
    if _histogram(y) != {c: n for c, n in shard.labels.items() if n}:
        raise DatasetError(f"{name}: its labels do not match the manifest's histogram")


def digits_source(test_fraction: float, seed: int) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """scikit-learn's 1,797 handwritten 8x8 digits, scaled to [0, 1], split stratified."""
    from sklearn.datasets import load_digits
    from sklearn.model_selection import train_test_split

    x, y = load_digits(return_X_y=True)
    x = (x / 16.0).astype(np.float32)
    xtr, xte, ytr, yte = train_test_split(
        x, y, test_size=test_fraction, random_state=seed, stratify=y
    )
    return {"train": (xtr, ytr), "test": (xte, yte)}


def synthetic_source(
    samples: int, test_fraction: float, seed: int
) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """Digits-shaped random samples (64 features, 10 classes), learnable: class-dependent means."""
    rng = np.random.default_rng(seed)
    centers = rng.uniform(0, 1, size=(10, 64)).astype(np.float32)
    y = rng.integers(0, 10, size=samples)
    x = np.clip(centers[y] + rng.normal(0, 0.3, size=(samples, 64)), 0, 1).astype(np.float32)
    n_test = max(1, int(samples * test_fraction))
    return {"train": (x[n_test:], y[n_test:]), "test": (x[:n_test], y[:n_test])}


def _check_source(
    url: str, splits: dict[str, tuple[np.ndarray, np.ndarray]], shard_samples: int
) -> None:
    if not splits:
        raise DatasetError(f"{url}: the dataset has no splits")
    if shard_samples < 1:
        raise DatasetError(f"{url}: shard_samples must be >= 1 (got {shard_samples})")
    features = set()
    for name, (x, y) in splits.items():
        if len(x) == 0:
            raise DatasetError(f"{url}: split {name!r} is empty")
        if x.ndim != 2 or len(x) != len(y):
            raise DatasetError(
                f"{url}: split {name!r} has x {x.shape} and y {y.shape}; "
                "expected N x features and N labels"
            )
        if not np.issubdtype(y.dtype, np.integer) or y.min() < 0:
            raise DatasetError(f"{url}: split {name!r} labels must be integers >= 0")
        features.add(x.shape[1])
    if len(features) != 1:
        raise DatasetError(f"{url}: splits disagree on the number of features {sorted(features)}")


def write_dataset(
    url: str,
    splits: dict[str, tuple[np.ndarray, np.ndarray]],
    shard_samples: int,
    ingest: dict | None = None,
) -> Manifest:
    """Write shards, then the manifest; a crash midway leaves no manifest pointing at nothing.

    Over an existing dataset the old manifest goes first (it would name shards being replaced),
    and shards that the new manifest does not name are deleted once it is in place.
    """
    url = url.rstrip("/")
    _check_source(url, splits, shard_samples)
    fs, root = filesystem(url)
    try:
        ensure_bucket(url)
    except OSError as e:
        raise DatasetError(
            f"s3://{root.split('/', 1)[0]}: cannot create or reach the bucket ({e})"
        ) from None
    with contextlib.suppress(FileNotFoundError):  # S3 deletes a missing key without a word
        fs.rm_file(f"{root}/{MANIFEST}")
    classes = int(max(int(y.max()) for _, y in splits.values()) + 1)
    infos: dict[str, SplitInfo] = {}
    for name, (x, y) in splits.items():
        shards = []
        for i, start in enumerate(range(0, len(x), shard_samples)):
            xs, ys = x[start : start + shard_samples], y[start : start + shard_samples]
            data = encode_shard(xs, ys)
            key = f"{name}/shard-{i:05d}.npz"
            fs.pipe_file(f"{root}/{key}", data)
            shards.append(
                ShardInfo(
                    key=key,
                    samples=len(xs),
                    bytes=len(data),
                    sha256=sha256(data),
                    labels=_histogram(ys),
                )
            )
        infos[name] = SplitInfo(samples=len(x), labels=_histogram(y), shards=shards)
    features = int(next(iter(splits.values()))[0].shape[1])
    manifest = Manifest(
        url=url, features=features, classes=classes, splits=infos, ingest=dict(ingest or {})
    )
    fs.pipe_file(f"{root}/{MANIFEST}", manifest.model_dump_json(indent=1).encode())
    _remove_stale_shards(fs, root, manifest)
    return manifest


def _remove_stale_shards(fs, root: str, manifest: Manifest) -> None:
    keep = {s.key for split in manifest.splits.values() for s in split.shards}
    stale = [
        p
        for p in fs.find(root)
        if _SHARD_KEY.match(p[len(root) + 1 :]) and p[len(root) + 1 :] not in keep
    ]
    if stale:
        fs.rm(stale)


def _histogram(y: np.ndarray) -> dict[int, int]:
    values, counts = np.unique(y, return_counts=True)
    return {int(v): int(c) for v, c in zip(values, counts, strict=True)}


def read_manifest(url: str) -> Manifest:
    """The manifest under `url`, checked for internal consistency; DatasetError naming why not."""
    url = url.rstrip("/")
    fs, root = filesystem(url)
    where = f"{url}/{MANIFEST}"
    try:
        raw = fs.cat_file(f"{root}/{MANIFEST}")
    except FileNotFoundError:
        raise MissingDataset(_why_missing(fs, url, root)) from None
    except OSError as e:
        raise DatasetError(f"{where}: cannot read ({e})") from None
    try:
        data = json.loads(raw)
        if not isinstance(data, dict):
            raise ValueError(f"expected a JSON object, got {type(data).__name__}")
        data["url"] = url
        return Manifest.model_validate(data)
    except ValidationError as e:
        from hetflow.config import describe_validation_error

        raise DatasetError(
            f"{where}: malformed manifest ({describe_validation_error(e)})"
        ) from None
    except ValueError as e:
        raise DatasetError(f"{where}: malformed manifest ({str(e).splitlines()[0]})") from None


def _why_missing(fs, url: str, root: str) -> str:
    if url.startswith("s3://"):
        bucket = root.split("/", 1)[0]
        try:
            exists = fs.exists(bucket)
        except OSError:
            exists = False
        if not exists:
            return f"s3://{bucket}: no such bucket (from dataset {url})"
    try:
        present = fs.find(root)
    except (FileNotFoundError, OSError):
        present = []
    if present:
        return (
            f"{url}/{MANIFEST}: missing although {len(present)} objects are under the prefix "
            "(an ingest that did not finish?); ingest again"
        )
    return (
        f"{url}: no dataset here (no {MANIFEST}); ingest it first (hetflow data ingest --url {url})"
    )


def check_shards(manifest: Manifest) -> None:
    """One listing: every shard the manifest names exists with the manifest's byte size."""
    fs, root = filesystem(manifest.url)
    try:
        listing = fs.find(root, detail=True)
    except OSError as e:
        raise DatasetError(f"{manifest.url}: cannot list the dataset ({e})") from None
    sizes = {p[len(root) + 1 :]: int(info.get("size") or 0) for p, info in listing.items()}
    for name, split in manifest.splits.items():
        for shard in split.shards:
            size = sizes.get(shard.key)
            if size is None:
                raise DatasetError(
                    f"{manifest.shard_url(shard)}: named in the manifest "
                    f"(split {name!r}) but missing"
                )
            if size != shard.bytes:
                raise ChecksumError(
                    f"{manifest.shard_url(shard)}: {size} bytes at the source, "
                    f"the manifest says {shard.bytes}"
                )


def read_existing(url: str) -> Manifest:
    """The manifest of a dataset a run reads as it is (`DatasetSpec.source` 'existing'), its
    shards there; a one-line DatasetError that says how to write it where there is none."""
    try:
        manifest = read_manifest(url)
    except MissingDataset as e:
        raise DatasetError(f"{e} (write it first: hetflow data ingest --to {url})") from None
    check_shards(manifest)
    return manifest


def verify_bytes(manifest_url: str, shard: ShardInfo, data: bytes) -> None:
    """Bytes fetched for `shard` are what the manifest promises, else ChecksumError."""
    if len(data) != shard.bytes or sha256(data) != shard.sha256:
        raise ChecksumError(
            f"{manifest_url}/{shard.key}: checksum mismatch at the source "
            f"({len(data)} bytes; expected {shard.bytes} with SHA-256 "
            f"{shard.sha256[:12]}...)"
        )


def verify_dataset(manifest: Manifest, deep: bool = False) -> None:
    """check_shards; with `deep`, also fetch every shard and compare its SHA-256."""
    check_shards(manifest)
    if not deep:
        return
    fs, root = filesystem(manifest.url)
    for split in manifest.splits.values():
        for shard in split.shards:
            verify_bytes(manifest.url, shard, fs.cat_file(f"{root}/{shard.key}"))
