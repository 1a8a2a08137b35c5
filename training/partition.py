"""Which samples each rank reads at each step (pure, deterministic for a seed).

The epoch order is a stratified shuffle: each class is shuffled, then the classes are
interleaved in proportion to their counts (the k-th of a class's n samples sits at (k + u) / n
of the epoch), so any window of the order has the class mix of the whole. Training reads that
order as one stream, epoch after epoch; step t takes stream positions [t*B, (t+1)*B) and rank r
takes its plan's slice of them. Every sample is therefore read exactly once per epoch whatever
the plan is, also when the plan changes mid-epoch, and each rank's share is its local batch.

    >>> rank_slices([16, 16, 32, 64])
    [(0, 16), (16, 32), (32, 64), (64, 128)]

Shard-local order (`shards=`, for reading from object storage shard by shard): the shards are
shuffled per epoch (in blocks of `block` shards) and each class walks through its samples in
that shard order, shuffled only within a block. The interleaving of the classes is the same as
above, so stratification and exactly-once are untouched, but a window of the stream needs only
the few shards around its position instead of all of them; `needed_shards` and
`upcoming_shards` tell a rank which shards its next steps read (for prefetch).
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
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


def shard_of_samples(shard_samples: Sequence[int]) -> np.ndarray:
    """Sample index -> shard index, for shards of the given sizes laid end to end."""
    return np.repeat(np.arange(len(shard_samples)), np.asarray(shard_samples, dtype=np.int64))


def epoch_order(
    labels: np.ndarray,
    seed: int,
    epoch: int,
    shards: np.ndarray | None = None,
    block: int = 1,
) -> np.ndarray:
    """A permutation of range(len(labels)), stratified by label, reshuffled per epoch.

    With `shards` (sample -> shard), each class visits its samples block of shards by block
    of shards, in an order of the shards drawn per epoch.
    """
    labels = np.asarray(labels)
    rng = np.random.default_rng([seed, epoch])
    group = None
    if shards is not None:
        shards = np.asarray(shards)
        if len(shards) != len(labels):
            raise ValueError(f"shards has {len(shards)} entries for {len(labels)} labels")
        n_shards = int(shards.max()) + 1 if len(shards) else 0
        position = np.empty(n_shards, dtype=np.int32)
        position[rng.permutation(n_shards)] = np.arange(n_shards)
        group = position[shards] // max(1, int(block))
    keys = np.empty(len(labels), dtype=np.float64)
    for c in np.unique(labels):
        idx = np.flatnonzero(labels == c)
        rng.shuffle(idx)
        if group is not None:
            idx = idx[np.argsort(group[idx], kind="stable")]
        # The k-th of n samples of a class sits at (k + u) / n of the epoch, u ~ U(0, 1).
        keys[idx] = (np.arange(len(idx)) + rng.uniform(0, 1)) / len(idx)
    order = np.argsort(keys, kind="stable")
    return order.astype(np.int32) if len(order) < 2**31 else order  # half the memory it keeps


def rank_slices(plan: Sequence[int]) -> list[tuple[int, int]]:
    bounds = np.concatenate([[0], np.cumsum(plan)]).astype(int)
    return [(int(a), int(b)) for a, b in itertools.pairwise(bounds)]


class Stream:
    """Stream positions -> sample indices over consecutive epoch orders."""

    def __init__(
        self, labels: np.ndarray, seed: int, shards: np.ndarray | None = None, block: int = 1
    ) -> None:
        self.labels = np.asarray(labels)
        self.n = len(self.labels)
        if self.n == 0:
            raise PartitionError("cannot stream an empty dataset")
        self.seed = seed
        self.shards = None if shards is None else np.asarray(shards)
        self.block = block
        # The epoch being read and the next (a step can span the boundary): an order is 4 bytes
        # per sample, the largest thing a rank keeps that grows with the dataset.
        self._order = lru_cache(maxsize=2)(
            lambda e: epoch_order(self.labels, self.seed, e, self.shards, self.block)
        )

    def order(self, epoch: int) -> np.ndarray:
        return self._order(epoch)

    def indices(self, start: int, stop: int) -> np.ndarray:
        out = []
        pos = start
        while pos < stop:
            epoch, offset = divmod(pos, self.n)
            take = min(stop - pos, self.n - offset)
            out.append(self._order(epoch)[offset : offset + take])
            pos += take
        return np.concatenate(out) if out else np.empty(0, dtype=np.int64)

    def step_positions(self, step: int, plan: Sequence[int], rank: int) -> tuple[int, int]:
        """The stream positions [start, stop) that rank `rank` reads at `step`."""
        base = step * sum(plan)
        a, b = rank_slices(plan)[rank]
        return base + a, base + b

    def step_indices(self, step: int, plan: Sequence[int], rank: int) -> np.ndarray:
        """The sample indices rank `rank` trains on at `step` (global batch = sum(plan))."""
        return self.indices(*self.step_positions(step, plan, rank))


def _unique_in_order(values: np.ndarray) -> list[int]:
    _, first = np.unique(values, return_index=True)
    return [int(v) for v in values[np.sort(first)]]


def window_indices(
    stream: Stream, step: int, n_steps: int, plan: Sequence[int], rank: int
) -> np.ndarray:
    """The sample indices rank `rank` reads at steps [step, step + n_steps), in order."""
    a, b = rank_slices(plan)[rank]
    if n_steps <= 0 or b == a:
        return np.empty(0, dtype=np.int64)
    starts = (step + np.arange(n_steps)) * sum(plan) + a
    pos = (starts[:, None] + np.arange(b - a)).ravel()
    epochs, offsets = np.divmod(pos, stream.n)
    out = np.empty(len(pos), dtype=np.int64)
    for e in np.unique(epochs):
        m = epochs == e
        out[m] = stream.order(int(e))[offsets[m]]
    return out


def shard_schedule(
    stream: Stream, shard_of: np.ndarray, step: int, n_steps: int, plan: Sequence[int], rank: int
) -> list[list[int]]:
    """For each of steps [step, step + n_steps): the shards rank `rank` reads, in order of need."""
    b = rank_slices(plan)[rank][1] - rank_slices(plan)[rank][0]
    if b == 0:
        return [[] for _ in range(n_steps)]
    rows = np.asarray(shard_of)[window_indices(stream, step, n_steps, plan, rank)].reshape(
        n_steps, b
    )
    return [_unique_in_order(row) for row in rows]


def needed_shards(
    stream: Stream, shard_of: np.ndarray, step: int, plan: Sequence[int], rank: int
) -> list[int]:
    """The shards rank `rank` reads at `step`, in the order of their first sample."""
    return shard_schedule(stream, shard_of, step, 1, plan, rank)[0]


class ShardSchedule:
    """`shard_schedule` of one rank under one plan, computed block by block and remembered."""

    def __init__(
        self, stream: Stream, shard_of: np.ndarray, plan: Sequence[int], rank: int, block: int = 32
    ) -> None:
        self.stream, self.shard_of, self.plan, self.rank = (
            stream,
            np.asarray(shard_of),
            list(plan),
            rank,
        )
        self.block = block
        self._rows: dict[int, list[int]] = {}

    def __call__(self, step: int) -> list[int]:
        if step not in self._rows:
            rows = shard_schedule(
                self.stream, self.shard_of, step, self.block, self.plan, self.rank
            )
            self._rows.update(zip(range(step, step + self.block), rows, strict=True))
        return self._rows[step]

    def forget_before(self, step: int) -> None:
        for t in [t for t in self._rows if t < step]:
            del self._rows[t]

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
    shard_of: np.ndarray,
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
    return ShardSchedule(stream, shard_of, plan, rank).upcoming(step, depth, horizon)
