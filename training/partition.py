"""Which samples each rank reads at each step (pure, deterministic for a seed).

The epoch order is a stratified shuffle: each class is shuffled, then the classes are
interleaved in proportion to their counts, so any window of the order has the class mix of the
whole. Training reads that order as one stream, epoch after epoch; step t takes stream positions
[t*B, (t+1)*B) and rank r takes its plan's slice of them. Every sample is therefore read exactly
once per epoch whatever the plan is, also when the plan changes mid-epoch, and each rank's share
is its local batch.

    >>> rank_slices([16, 16, 32, 64])
    [(0, 16), (16, 32), (32, 64), (64, 128)]
"""

from __future__ import annotations

from collections.abc import Sequence
from functools import lru_cache

import numpy as np


def epoch_order(labels: np.ndarray, seed: int, epoch: int) -> np.ndarray:
    """A permutation of range(len(labels)), stratified by label, reshuffled per epoch."""
    labels = np.asarray(labels)
    rng = np.random.default_rng([seed, epoch])
    keys = np.empty(len(labels), dtype=np.float64)
    for c in np.unique(labels):
        idx = np.flatnonzero(labels == c)
        rng.shuffle(idx)
        # The k-th of n samples of a class sits at (k + u) / n of the epoch, u ~ U(0, 1).
        keys[idx] = (np.arange(len(idx)) + rng.uniform(0, 1)) / len(idx)
    return np.argsort(keys, kind="stable")


def rank_slices(plan: Sequence[int]) -> list[tuple[int, int]]:
    bounds = np.concatenate([[0], np.cumsum(plan)]).astype(int)
    return [(int(a), int(b)) for a, b in zip(bounds[:-1], bounds[1:], strict=True)]


class Stream:
    """Stream positions -> sample indices over consecutive epoch orders."""

    def __init__(self, labels: np.ndarray, seed: int) -> None:
        self.labels = np.asarray(labels)
        self.n = len(self.labels)
        self.seed = seed
        self._order = lru_cache(maxsize=4)(lambda e: epoch_order(self.labels, self.seed, e))

    def indices(self, start: int, stop: int) -> np.ndarray:
        out = []
        pos = start
        while pos < stop:
            epoch, offset = divmod(pos, self.n)
            take = min(stop - pos, self.n - offset)
            out.append(self._order(epoch)[offset : offset + take])
            pos += take
        return np.concatenate(out) if out else np.empty(0, dtype=np.int64)

    def step_indices(self, step: int, plan: Sequence[int], rank: int) -> np.ndarray:
        """The sample indices rank `rank` trains on at `step` (global batch = sum(plan))."""
        base = step * sum(plan)
        a, b = rank_slices(plan)[rank]
        return self.indices(base + a, base + b)
