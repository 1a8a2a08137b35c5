"""Which samples each rank reads at each step (pure, deterministic for a seed).

The epoch order is a stratified, shard-local shuffle computed position by position from (seed,
epoch, position) and the per-shard class counts (`SampleIndex`), never a table per sample.
Step t reads stream positions [t*B, (t+1)*B) and rank r its plan's slice of them: every sample
is read once per epoch whatever the plan, also when it changes mid-epoch, and a restart needs
no state. How the order is drawn: docs/data.md ("How ranks read it").

    >>> rank_slices([16, 16, 32, 64])
    [(0, 16), (16, 32), (32, 64), (64, 128)]
    >>> idx = SampleIndex([[2, 1], [0, 3]])  # shard 0: 2 of class 0, 1 of class 1; shard 1: 3
    >>> idx.shard_of(np.arange(6)).tolist(), idx.class_of(np.arange(6)).tolist()
    ([0, 0, 0, 1, 1, 1], [0, 0, 1, 1, 1, 1])
    >>> sorted(Stream(idx, seed=0).indices(6, 12).tolist())  # epoch 1: each sample once
    [0, 1, 2, 3, 4, 5]

`needed_shards` and `upcoming_shards` tell a rank which shards its next steps read (for
prefetch).
"""

from __future__ import annotations

import itertools
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass
from functools import lru_cache

import numpy as np


class PartitionError(ValueError):
    """A plan that cannot be laid over the dataset (more ranks than samples, ...)."""


def check_plan(n_samples: int, plan: Sequence[int], name: str = "dataset") -> None:
    """Raise PartitionError, naming `name`, unless `plan` can share `n_samples` samples."""
    if not plan:
        raise PartitionError(f"{name}: the plan has no ranks")
    if any(int(b) < 0 for b in plan) or sum(plan) < 1:
        raise PartitionError(
            f"{name}: local batches must be >= 0 and sum to >= 1 (got {list(plan)})"
        )
    if len(plan) > n_samples:
        raise PartitionError(
            f"{name}: {len(plan)} ranks but only {n_samples} samples; every rank needs at least one"
        )
    if sum(plan) > n_samples:
        raise PartitionError(
            f"{name}: global batch {sum(plan)} is larger than its {n_samples} "
            "samples; a step would repeat samples"
        )


def _exclusive_cumsum(a: np.ndarray, axis: int = 0) -> np.ndarray:
    c = np.cumsum(a, axis=axis)
    return c - a


class SampleIndex:
    """A split's samples numbered shard by shard, class by class within a shard, from
    `counts[s, c]` (the number of samples of class column c in shard s, >= 0). Holds
    O(shards x classes) integers; maps any sample to its shard and class without a table per
    sample. `offsets[s]` is shard s's first sample, `class_start[s, c]` the offset of its
    class-c samples within it."""

    def __init__(self, counts: np.ndarray | Sequence[Sequence[int]]) -> None:
        counts = np.asarray(counts, dtype=np.int64)
        if counts.ndim != 2 or (counts < 0).any():
            raise ValueError(f"counts must be a (shards, classes) array >= 0, got {counts.shape}")
        if (counts.sum(axis=0) == 0).any():
            raise ValueError("every class column must count at least one sample")
        self.counts = counts
        self.samples = counts.sum(axis=1)  # per shard
        self.ends = np.cumsum(self.samples)
        self.offsets = self.ends - self.samples
        self.class_start = _exclusive_cumsum(counts, axis=1)
        self._class_end = self.class_start + counts
        self.totals = counts.sum(axis=0)  # per class
        self.n = int(self.ends[-1]) if len(self.ends) else 0

    @property
    def shards(self) -> int:
        return self.counts.shape[0]

    @property
    def classes(self) -> int:
        return self.counts.shape[1]

    def shard_of(self, idx: np.ndarray) -> np.ndarray:
        """The shard of each sample index in [0, n) (int64)."""
        return np.searchsorted(self.ends, np.asarray(idx, dtype=np.int64), side="right")

    def class_of(self, idx: np.ndarray) -> np.ndarray:
        """The class column of each sample index in [0, n) (int64): O(len(idx) x classes)."""
        idx = np.asarray(idx, dtype=np.int64)
        s = self.shard_of(idx)
        local = idx - self.offsets[s]
        return (local[:, None] >= self._class_end[s]).sum(axis=1)


@dataclass(frozen=True)
class _Epoch:
    """What one epoch draws up front: O(shards x classes)."""

    shards: np.ndarray  # the shards in this epoch's order
    u: np.ndarray  # per class: its keys' phase
    # Class by class, the class's samples in the blocks before block b, plus c * (n + 1) so
    # that the whole is ascending: entry c * (blocks + 1) + b.
    starts: np.ndarray


class Stream:
    """Stream positions -> sample indices over consecutive epoch orders (docs/data.md).

    `index`: a SampleIndex or its counts. `block`: shards per block of the shard-local order
    (None: one block of all shards, the unlocal stratified shuffle, O(n) per epoch). The
    sample at a position depends only on (index, seed, block, position): every epoch is a
    permutation of range(n), and a fresh stream (a restarted rank) gives the same samples.
    Memory: the index, two epochs' draws (O(shards x classes)) and the within-block
    permutations of the last `tables` (block, class) pairs used (default 2 x classes + 2; each
    4 bytes per sample of one class in one block, recomputed when needed again).
    """

    def __init__(
        self, index: SampleIndex | np.ndarray, seed: int, block: int | None = 1, tables: int = 0
    ) -> None:
        self.index = index if isinstance(index, SampleIndex) else SampleIndex(index)
        self.n = self.index.n
        if self.n == 0:
            raise PartitionError("cannot stream an empty dataset")
        self.seed = int(seed)
        self.block = self.index.shards if block is None else max(1, int(block))
        self._epoch = lru_cache(maxsize=2)(self._draw)  # the epoch being read and the next
        self._tables: OrderedDict[tuple[int, int, int], np.ndarray] = OrderedDict()
        self._max_tables = tables or 2 * self.index.classes + 2
        self._nf = self.index.totals.astype(np.float64)

    def _draw(self, epoch: int) -> _Epoch:
        rng = np.random.default_rng([self.seed, epoch])
        shards = rng.permutation(self.index.shards)
        u = rng.uniform(0, 1, size=self.index.classes)
        starts = np.arange(0, self.index.shards, self.block)
        per_block = np.add.reduceat(self.index.counts[shards], starts, axis=0)
        cum = np.concatenate([np.zeros((1, self.index.classes), np.int64), np.cumsum(per_block, 0)])
        starts = (cum.T + (np.arange(self.index.classes) * (self.n + 1))[:, None]).ravel()
        return _Epoch(shards, u, starts)

    def shard_order(self, epoch: int) -> np.ndarray:
        """The shards in epoch `epoch`'s order; block b is its entries [b * block, (b + 1) *
        block), and each class reads its samples block after block."""
        return self._epoch(epoch).shards

    def _below(self, x: float, u: np.ndarray) -> np.ndarray:
        """Per class, how many of its keys (k + u_c) / n_c are < x (float64, exactly as
        `_window` computes them; keys are non-decreasing in k)."""
        n = self.index.totals
        k = np.clip(np.ceil(x * self._nf - u), 0, n).astype(np.int64)
        while True:
            down = (k > 0) & ((k - 1 + u) / self._nf >= x)
            up = (k < n) & ((k + u) / self._nf < x)
            if not (down.any() or up.any()):
                return k
            k = k - down + up

    def _window(self, epoch: int, a: int, b: int) -> tuple[np.ndarray, np.ndarray]:
        """(class, k) of epoch positions [a, b): the k-th sample of that class."""
        u, n, classes = self._epoch(epoch).u, self.n, self.index.classes
        x = max(0.0, (a - classes) / n)
        lo = self._below(x, u)
        while lo.sum() > a:  # rounding: start lower
            x = max(0.0, x - (classes + 1) / n)
            lo = self._below(x, u)
        skip = a - int(lo.sum())
        need = skip + (b - a)
        y = x + (need + classes + 1) / n
        hi = self._below(y, u)
        while hi.sum() - lo.sum() < need:
            y += (need + classes + 1) / n
            hi = self._below(y, u)
        # Every key in [x, y) of every class, in the order's order (key, then class).
        many = hi - lo
        cls = np.repeat(np.arange(classes), many)
        k = np.arange(int(many.sum())) + np.repeat(lo - _exclusive_cumsum(many), many)
        keys = (k + u[cls]) / self._nf[cls]
        pick = np.lexsort((cls, keys))[skip:need]
        return cls[pick], k[pick]

    def _table(self, epoch: int, block: int, c: int) -> np.ndarray:
        """The sample indices of class c in block `block` of `epoch`, shuffled: the class's
        samples there in the order it reads them."""
        key = (epoch, block, c)
        if key in self._tables:
            self._tables.move_to_end(key)
            return self._tables[key]
        ix = self.index
        shards = self._epoch(epoch).shards[block * self.block : (block + 1) * self.block]
        many = ix.counts[shards, c]
        first = ix.offsets[shards] + ix.class_start[shards, c]
        ids = np.arange(int(many.sum())) + np.repeat(first - _exclusive_cumsum(many), many)
        if self.n < 2**31:
            ids = ids.astype(np.int32)  # half the memory it keeps
        table = np.random.default_rng([self.seed, epoch, block, c]).permutation(ids)
        self._tables[key] = table
        while len(self._tables) > self._max_tables:
            self._tables.popitem(last=False)
        return table

    def _epoch_indices(self, epoch: int, a: int, b: int) -> np.ndarray:
        cls, k = self._window(epoch, a, b)
        starts, classes = self._epoch(epoch).starts, self.index.classes
        blocks = len(starts) // classes  # + 1
        key = k + cls * (self.n + 1)
        at = np.searchsorted(starts, key, side="right") - 1  # the block holding each
        pair, where = np.unique((at - cls * blocks) * classes + cls, return_inverse=True)
        tables = [self._table(epoch, int(p) // classes, int(p) % classes) for p in pair]
        first = _exclusive_cumsum(np.asarray([len(t) for t in tables], dtype=np.int64))
        return np.concatenate(tables)[first[where] + key - starts[at]].astype(np.int64)

    def indices(self, start: int, stop: int) -> np.ndarray:
        """The sample indices at stream positions [start, stop) (int64)."""
        out = []
        pos = start
        while pos < stop:
            epoch, offset = divmod(pos, self.n)
            take = min(stop - pos, self.n - offset)
            out.append(self._epoch_indices(epoch, offset, offset + take))
            pos += take
        return np.concatenate(out) if out else np.empty(0, dtype=np.int64)

    def order(self, epoch: int) -> np.ndarray:
        """Epoch `epoch`'s whole order (O(n): for tests and small data; training reads
        `indices`)."""
        return self.indices(epoch * self.n, (epoch + 1) * self.n)

    def step_positions(self, step: int, plan: Sequence[int], rank: int) -> tuple[int, int]:
        """The stream positions [start, stop) that rank `rank` reads at `step`."""
        base = step * sum(plan)
        a, b = rank_slices(plan)[rank]
        return base + a, base + b

    def step_indices(self, step: int, plan: Sequence[int], rank: int) -> np.ndarray:
        """The sample indices rank `rank` trains on at `step` (global batch = sum(plan))."""
        return self.indices(*self.step_positions(step, plan, rank))


def epoch_order(
    index: SampleIndex | np.ndarray, seed: int, epoch: int, block: int | None = 1
) -> np.ndarray:
    """Epoch `epoch`'s order over `index`'s samples: a permutation of range(n), stratified by
    class, reshuffled per epoch (materialized: O(n), for tests and small data)."""
    return Stream(index, seed, block).order(epoch)


def rank_slices(plan: Sequence[int]) -> list[tuple[int, int]]:
    bounds = np.concatenate([[0], np.cumsum(plan)]).astype(int)
    return [(int(a), int(b)) for a, b in itertools.pairwise(bounds)]


def _unique_in_order(values: np.ndarray) -> list[int]:
    _, first = np.unique(values, return_index=True)
    return [int(v) for v in values[np.sort(first)]]


def shard_schedule(
    stream: Stream, step: int, n_steps: int, plan: Sequence[int], rank: int
) -> list[list[int]]:
    """For each of steps [step, step + n_steps): the shards rank `rank` reads, in order of need."""
    steps = range(step, step + n_steps)
    return [
        _unique_in_order(stream.index.shard_of(stream.step_indices(t, plan, rank))) for t in steps
    ]


def needed_shards(stream: Stream, step: int, plan: Sequence[int], rank: int) -> list[int]:
    """The shards rank `rank` reads at `step`, in the order of their first sample."""
    return shard_schedule(stream, step, 1, plan, rank)[0]


class ShardSchedule:
    """`shard_schedule` of one rank under one plan, computed block by block and remembered.

    The sample indices of the rows computed for the next 2 x `block` steps (from the step last
    passed to `forget_before`; `upcoming` looks past the first block) are kept until `indices`
    hands them out, so that a step's indices are computed once: at most 2 x `block` x the local
    batch x 4 bytes (int32 below 2**31 samples).
    """

    def __init__(self, stream: Stream, plan: Sequence[int], rank: int, block: int = 32) -> None:
        self.stream, self.plan, self.rank = stream, list(plan), rank
        self.block = block
        self._rows: dict[int, list[int]] = {}
        self._indices: dict[int, np.ndarray] = {}
        self._now = 0

    def __call__(self, step: int) -> list[int]:
        if step not in self._rows:
            for t in range(step, step + self.block):
                idx = self.stream.step_indices(t, self.plan, self.rank)
                self._rows[t] = _unique_in_order(self.stream.index.shard_of(idx))
                if t < self._now + 2 * self.block:
                    self._indices[t] = idx.astype(np.int32) if self.stream.n < 2**31 else idx
        return self._rows[step]

    def indices(self, step: int) -> np.ndarray:
        """`stream.step_indices(step, plan, rank)`, taken from the rows when they hold it."""
        idx = self._indices.pop(step, None)
        if idx is None:
            return self.stream.step_indices(step, self.plan, self.rank)
        return idx.astype(np.int64)

    def forget_before(self, step: int) -> None:
        self._now = step
        for t in [t for t in self._rows if t < step]:
            del self._rows[t]
        for t in [t for t in self._indices if t < step]:
            del self._indices[t]

    def upcoming(self, step: int, depth: int, horizon: int = 256) -> list[int]:
        """The first `depth` shards that steps after `step` read and `step` does not, in order."""
        current = set(self(step))
        out: list[int] = []
        for t in range(step + 1, step + 1 + horizon):
            if len(out) >= depth:
                break
            for s in self(t):
                if s not in current and s not in out:
                    out.append(s)
        return out[:depth]


def upcoming_shards(
    stream: Stream,
    step: int,
    plan: Sequence[int],
    rank: int,
    depth: int,
    horizon: int = 256,
) -> list[int]:
    """The next `depth` shards rank `rank` will read after `step` (assuming the plan holds).

    In order of first need, leaving out the shards that `step` itself reads; looks at most
    `horizon` steps ahead.
    """
    if depth <= 0:
        return []
    return ShardSchedule(stream, plan, rank).upcoming(step, depth, horizon)
