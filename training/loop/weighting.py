"""The weighting of each rank's summed loss (`MeanOverCounts`), so that the all-reduced gradient
is the global batch's mean whatever each rank's share and count."""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch import nn


class MeanOverCounts:
    """Weights each rank's summed loss so that DDP's all-reduced gradient is the gradient of
    the MEAN over the global batch's counts (samples, or tokens), whatever each rank counts.

    DDP averages the ranks' gradients, so rank r backpropagates S_r x world / N, with S_r its
    summed loss and N the count summed over every rank; `world` is the number of ranks in the
    all-reduce (fewer where a plan leaves ranks out of it: `training.computing`).

    A recipe whose loss counts the same per sample (`Recipe.count_per_sample`: 1 for a
    classifier, the context for full token windows) needs no communication: N is that times
    the plan's global batch, which every rank knows; each rank checks its own count. Otherwise
    N is all-reduced on a control group of its own (`new_control_group`) in the background,
    issued as soon as the forward pass knows the rank's count: backward runs with the previous
    step's N, the same on every rank, and `correct` rescales the averaged gradient by (that N)
    / (this step's N) where they differ, before the optimizer step. Waiting for N before
    backward would stall every rank's compute phase until the slowest rank's forward pass
    ended; the first step (no previous N) waits for it. A collective per step slows a short
    CPU step (docs/measurements/loop.md, "Step-time sharing"), hence the fixed-count path.
    Exact for all-reduce and fp16/bf16; with compression that keeps state (PowerSGD's and
    top-k's error feedback) the state is in units of the previous N, a difference of
    (N_prev / N - 1) on one step's residual. With `accumulate` (`train.accumulate` 'auto') the
    first step too backpropagates with an N every rank knows, the global batch's samples, and
    `correct` rescales it: a rank's earlier micro-batches go back before its count is known.
    """

    def __init__(
        self, world: int, per_sample: int | None, group=None, accumulate: bool = False
    ) -> None:
        self.world, self.per_sample, self.group = world, per_sample, group
        self.accumulate = accumulate
        self.expected: int | None = None  # N of the previous step: what backward scales by
        self._pending: tuple[dist.Work, torch.Tensor] | None = None

    def backward(
        self,
        loss_sum: torch.Tensor,
        count: int,
        batch: int,
        global_batch: int,
        scale=None,
        *,
        last: bool = True,
        total: int | None = None,
    ) -> None:
        """Backward of loss_sum x world / N for this rank's `count` over its `batch` samples,
        of the plan's `global_batch`; `scale` (the shared loss scale, `MixedPrecision.scale`)
        applied to it first. A share run as micro-batches calls it once for each: `last` False
        on all but the last, which all-reduce no count; the last passes `total`, the count of
        them all, the one all-reduced. Every micro-batch is scaled by the same N, so their
        summed gradient is the share's (and `correct` rescales it as a whole)."""
        scale = scale or (lambda t: t)
        self.check(count, batch)
        if self.per_sample is not None:
            self.expected = global_batch * self.per_sample
            scale(loss_sum * (self.world / max(self.expected, 1))).backward()
            return
        if self.expected is None and self.accumulate:
            # a rank's first micro-batches go back before its count is known: every rank takes
            # the global batch as N on the first step, and `correct` rescales to the true one
            self.expected = global_batch
        if last:
            counted = torch.tensor([int(count if total is None else total)], dtype=torch.int64)
            work = dist.all_reduce(counted, group=self.group, async_op=True)
            if self.expected is None:
                work.wait()
                self.expected = int(counted)
            self._pending = (work, counted)
        scale(loss_sum * (self.world / max(self.expected, 1))).backward()

    def check(self, count: int, batch: int) -> None:
        """That a recipe with a fixed count per sample counted `count` for `batch` samples."""
        if self.per_sample is not None and count != batch * self.per_sample:
            raise ValueError(
                f"train.recipe: its loss counted {count} for {batch} samples, not the "
                f"{self.per_sample} per sample its count_per_sample says"
            )

    def skip(self) -> None:
        """A step this rank computes nothing in and is out of the gradient's all-reduce
        (`training.computing`): where the count is all-reduced, its count of 0 joins that
        all-reduce, which every rank issues each step, and `expected` follows it."""
        if self.per_sample is None:
            total = torch.zeros(1, dtype=torch.int64)
            dist.all_reduce(total, group=self.group)
            self.expected = max(int(total), 1)

    def correct(self, model: nn.Module) -> int:
        """Rescale the gradients to this step's N (a no-op when it equals the one backward
        used); returns N."""
        if self._pending is None:
            return self.expected
        work, total = self._pending
        self._pending = None
        work.wait()
        n = int(total)
        if n != self.expected and n > 0:
            factor = self.expected / n
            for p in model.parameters():
                if p.grad is not None:
                    p.grad.mul_(factor)
        self.expected = max(n, 1)
        return n
