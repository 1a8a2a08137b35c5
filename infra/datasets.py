"""Datasets as NumPy `.npz` shards plus a JSON manifest, under any fsspec URL (S3 first).

Layout under the dataset URL::

    manifest.json                      written last: a reader never sees shards that are missing
    train/shard-00000.npz              arrays `x` (float32, N x 64) and `y` (int64, N)
    test/shard-00000.npz

The manifest lists, per split, each shard's key, sample count, label histogram, byte size and
SHA-256, so that a reader can check what it fetched.
"""

from __future__ import annotations

import hashlib
import io
import json

import numpy as np
from pydantic import BaseModel

from infra.s3 import ensure_bucket, filesystem

MANIFEST = "manifest.json"


class DatasetError(ValueError):
    """A dataset that is missing, malformed, or does not match its manifest (names the object)."""


class ShardInfo(BaseModel):
    key: str
    samples: int
    bytes: int
    sha256: str
    labels: dict[int, int]


class SplitInfo(BaseModel):
    samples: int
    labels: dict[int, int]
    shards: list[ShardInfo]


class Manifest(BaseModel):
    url: str
    format: str = "npz"
    features: int
    classes: int
    splits: dict[str, SplitInfo]


def sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def encode_shard(x: np.ndarray, y: np.ndarray) -> bytes:
    buf = io.BytesIO()
    np.savez(buf, x=x.astype(np.float32), y=y.astype(np.int64))
    return buf.getvalue()


def decode_shard(data: bytes, name: str) -> tuple[np.ndarray, np.ndarray]:
    try:
        with np.load(io.BytesIO(data)) as z:
            return z["x"], z["y"]
    except Exception as e:  # zipfile/pickle/KeyError: any of them means a bad shard
        raise DatasetError(f"{name}: not a valid npz shard ({type(e).__name__})") from None


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


def write_dataset(
    url: str, splits: dict[str, tuple[np.ndarray, np.ndarray]], shard_samples: int
) -> Manifest:
    """Write shards, then the manifest; a crash midway leaves no manifest pointing at nothing."""
    for name, (x, y) in splits.items():
        if len(x) == 0:
            raise DatasetError(f"{url}: split {name!r} is empty")
    ensure_bucket(url)
    fs, root = filesystem(url)
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
    manifest = Manifest(url=url, features=int(x.shape[1]), classes=classes, splits=infos)
    fs.pipe_file(f"{root}/{MANIFEST}", manifest.model_dump_json(indent=1).encode())
    return manifest


def _histogram(y: np.ndarray) -> dict[int, int]:
    values, counts = np.unique(y, return_counts=True)
    return {int(v): int(c) for v, c in zip(values, counts, strict=True)}


def read_manifest(url: str) -> Manifest:
    fs, root = filesystem(url)
    where = f"{url}/{MANIFEST}"
    try:
        raw = fs.cat_file(f"{root}/{MANIFEST}")
    except FileNotFoundError:
        raise DatasetError(f"{where}: no manifest (has the dataset been ingested?)") from None
    try:
        data = json.loads(raw)
        data["url"] = url
        return Manifest.model_validate(data)
    except (ValueError, TypeError) as e:
        raise DatasetError(f"{where}: malformed manifest ({str(e).splitlines()[0]})") from None
