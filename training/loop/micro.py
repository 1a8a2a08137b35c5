"""Micro-batches: a rank's share of a step past its memory cap, run as several passes whose
gradients accumulate (`train.accumulate` 'auto'); the sizes are the plan's
(`training.plan.balance.micro_split`)."""

from __future__ import annotations

import torch

from hetflow.training.launch.spec import RunSpec
from hetflow.training.plan.balance import micro_split


def micro_caps(spec: RunSpec) -> list[int | None] | None:
    """Every rank's largest micro-batch (launched rank order, as the spec's plan): its memory
    cap where `train.accumulate` is 'auto' (the plan's caps, else the cluster file's), None
    for a rank with no cap known; None where accumulation is off."""
    if spec.train.accumulate != "auto":
        return None
    return list(spec.plan.caps) or [w.memory_cap_batch for w in spec.cluster.workers]


def micro_cap(spec: RunSpec, rank: int) -> int | None:
    """`rank`'s largest micro-batch (`micro_caps`); None where its share runs in one pass."""
    caps = micro_caps(spec)
    return None if caps is None else caps[rank]


def micro_count(n: int, cap: int | None) -> int:
    """How many passes a batch of `n` samples runs as under `cap` (1 for an empty one)."""
    return max(len(micro_split(n, cap)), 1)


def splits(n: int, cap: int | None) -> bool:
    """Whether a share of `n` samples runs as more than one micro-batch under `cap`."""
    return micro_count(n, cap) > 1


def split_batch(batch: tuple[torch.Tensor, ...], n: int, cap: int | None) -> list[tuple]:
    """A recipe's batch of `n` samples as its micro-batches (`balance.micro_split` under
    `cap`): each tensor sliced along its first dimension, the samples' (`Recipe.batch`)."""
    sizes = micro_split(n, cap)
    if len(sizes) <= 1:
        return [batch]
    return list(zip(*(torch.split(t, sizes) for t in batch), strict=True))
