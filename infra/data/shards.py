"""What a shard of each manifest kind holds as training samples (pure, no I/O).

A sample is what one row of a step's batch is, numbered shard by shard:

- `tabular`: a row of features (float32), its label from the shard's histogram;
- `images`: an image (uint8, C x H x W), its label likewise;
- `tokens`: a window of `context + 1` tokens, windows `context` tokens apart, so that the
  targets of one window (`x[1:]`) end where the next window's inputs begin; label 0. A shard of
  T tokens holds (T - 1) // context windows (none when T <= context); windows never cross
  shards, so a shard alone decodes into its samples.

Within a shard, samples are numbered class by class (a stable sort by label): the numbering
`split_layout` gives from the manifest's label histograms alone, before any shard is read, and
`decode_samples` the order a shard's samples come in once it is read. The partitioner relies on
it: it maps the k-th sample of a class in a shard to an index with no table per sample.

    >>> windows_in(tokens=1025, context=256), windows_in(tokens=256, context=256)
    (4, 0)
    >>> token_windows(np.arange(7), context=3).tolist()
    [[0, 1, 2, 3], [3, 4, 5, 6]]
"""

from __future__ import annotations

import io
from dataclasses import dataclass

import numpy as np

from hetflow.infra.data.format import DatasetError, Manifest, ShardInfo
from hetflow.infra.data.partition import SampleIndex

KINDS = ("tabular", "images", "tokens")


def kind_of(manifest: Manifest) -> str:
    """The manifest's kind; manifests written before kinds existed are tabular."""
    return getattr(manifest, "kind", None) or "tabular"


def windows_in(tokens: int, context: int) -> int:
    """Windows of `context + 1` tokens, `context` apart, in a shard of `tokens` tokens."""
    return max(0, (int(tokens) - 1) // int(context))


def token_windows(tokens: np.ndarray, context: int) -> np.ndarray:
    """(windows_in(len(tokens), context), context + 1) int64: the shard's training windows."""
    n = windows_in(len(tokens), context)
    starts = np.arange(n)[:, None] * context
    return np.asarray(tokens, dtype=np.int64)[starts + np.arange(context + 1)]


def shard_tokens(shard: ShardInfo) -> int:
    """A token shard's token count (the manifest's `tokens`, else its `samples`)."""
    return int(getattr(shard, "tokens", None) or shard.samples)


@dataclass(frozen=True)
class SplitLayout:
    """A split's samples as the reader numbers them: shard by shard, class by class within a
    shard. `shards` lists the manifest's shards that hold at least one sample, in the
    manifest's order; `classes` the split's label values (ascending), the columns of
    `index.counts` (samples of each class per listed shard). O(shards x classes), whatever the
    number of samples: a sample's shard and label are computed from its number."""

    shards: list[ShardInfo]
    classes: np.ndarray  # label values, ascending
    index: SampleIndex

    @property
    def samples(self) -> np.ndarray:
        """Samples per listed shard."""
        return self.index.samples

    @property
    def offsets(self) -> np.ndarray:
        """The first sample of each listed shard."""
        return self.index.offsets

    @property
    def total(self) -> int:
        return self.index.n


def check_context(manifest: Manifest, context: int | None, split: str = "train") -> None:
    """DatasetError naming the dataset when `context` does not fit it: a token dataset without
    a context, or one with no shard longer than the context; a context for another kind."""
    kind, name = kind_of(manifest), f"{manifest.url} ({split} split)"
    if kind != "tokens":
        if context is not None:
            raise DatasetError(f"{name}: a context ({context}) is for token data, not {kind}")
        return
    if context is None or context < 1:
        raise DatasetError(f"{name}: token data needs a context >= 1 (got {context})")
    longest = max(shard_tokens(s) for s in manifest.splits[split].shards)
    if windows_in(longest, context) == 0:
        raise DatasetError(
            f"{name}: context {context} is longer than the data allows "
            f"(longest shard: {longest} tokens; a window needs {context + 1})"
        )


def split_layout(manifest: Manifest, split: str, context: int | None = None) -> SplitLayout:
    """The reader's numbering of `split`'s samples (`context`: for token data), from the
    manifest alone (its per-shard label histograms; token windows are label 0)."""
    if split not in manifest.splits:
        raise DatasetError(f"{manifest.url}: no split {split!r} (has {sorted(manifest.splits)})")
    check_context(manifest, context, split)
    tokens = kind_of(manifest) == "tokens"
    shards, hists = [], []
    for shard in manifest.splits[split].shards:
        hist = {0: windows_in(shard_tokens(shard), context)} if tokens else shard.labels
        if sum(hist.values()):
            shards.append(shard)
            hists.append(hist)
    classes = np.asarray(sorted({c for h in hists for c, k in h.items() if k}), dtype=np.int64)
    counts = np.asarray(
        [[h.get(int(c), 0) for c in classes] for h in hists], dtype=np.int64
    ).reshape(len(hists), len(classes))
    return SplitLayout(shards=shards, classes=classes, index=SampleIndex(counts))


def empty_samples(manifest: Manifest, context: int | None) -> np.ndarray:
    """No samples, shaped and typed as the kind's samples (a rank whose local batch is 0)."""
    kind = kind_of(manifest)
    if kind == "tokens":
        return np.empty((0, int(context or 0) + 1), dtype=np.int64)
    if kind == "images":
        return np.empty((0, *getattr(manifest, "shape", [])), dtype=np.uint8)
    return np.empty((0, manifest.features), dtype=np.float32)


def decode_samples(
    manifest: Manifest, shard: ShardInfo, data: bytes, context: int | None
) -> tuple[np.ndarray, np.ndarray]:
    """A shard's bytes (already checksum-validated) as its samples (x, y), class by class."""
    name = manifest.shard_url(shard)
    if kind_of(manifest) == "tokens":
        try:
            tokens = np.load(io.BytesIO(data), allow_pickle=False)
        except Exception as e:
            raise DatasetError(
                f"{name}: not a valid .npy token shard ({type(e).__name__})"
            ) from None
        if tokens.ndim != 1 or len(tokens) != shard_tokens(shard):
            raise DatasetError(
                f"{name}: holds {tokens.shape} tokens, the manifest says {shard_tokens(shard)}"
            )
        x = token_windows(tokens, context)
        return x, np.zeros(len(x), dtype=np.int64)
    from hetflow.infra.data.format import check_shard, decode_shard

    if kind_of(manifest) == "images":
        x, y = _decode_images(data, name, tuple(getattr(manifest, "shape", ()) or ()))
    else:
        x, y = decode_shard(data, name)
    check_shard(shard, x, y, name)
    order = np.argsort(y, kind="stable")
    return x[order], y[order]


def _decode_images(data: bytes, name: str, shape: tuple[int, ...]) -> tuple[np.ndarray, np.ndarray]:
    """An `.npz` image shard: `x` uint8 (N, C, H, W) of the manifest's shape, `y` int64 (N)."""
    try:
        with np.load(io.BytesIO(data), allow_pickle=False) as z:
            x, y = z["x"], z["y"]
    except Exception as e:
        raise DatasetError(f"{name}: not a valid npz image shard ({type(e).__name__})") from None
    if x.dtype != np.uint8 or x.shape[1:] != shape or y.shape != (len(x),):
        raise DatasetError(
            f"{name}: images {x.dtype} {x.shape} and labels {y.shape}; the manifest says "
            f"uint8 (N, {', '.join(map(str, shape))})"
        )
    return x, y.astype(np.int64)
