"""Every rank's compute time of every step, shared in the background, so that no step waits."""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.distributed as dist

from hetflow.records import StepRecord
from hetflow.training.plan.curves import relative_spread


class SharedStepTimes:
    """Every rank's compute time of every step, shared in the background, so that no step waits.

    A rank posts each step's compute time; every `every` posts they go out in one asynchronous
    all-gather on a control group of its own (`new_control_group`: gloo runs it in the
    background, apart from the gradients' collectives), collected at the next one, by when it has
    long finished. `collect(flush=True)` sends and waits for the rest, where every step must be
    accounted for (a checkpoint, the run's end). A collected row splits its step's wait into idle
    (for the slowest rank) and communication, and feeds the re-balancer.

    The dynamic schedule shares every step (`every=1`), so that a sudden change of speed is
    acted on within a few steps (`Rebalancer.sudden_change`); the others every K steps, because
    a collective per step slows short steps on a shared host (`benchmarks/step_sharing.py`;
    measured: docs/measurements/loop.md). torch has no per-step sharing of metrics.

    Every rank must post and collect the same steps with the same `flush`, in the same order:
    each send is a collective.

    `kept` (None: off): where each collected row is also kept, step -> row, for the whole run
    (under `faults.on_loss: continue`, `elastic.lost`: the survivors build a lost rank's
    stretch from its column); a dict entry per step, no collective.
    """

    def __init__(self, world: int, group, every: int) -> None:
        self.world, self.group, self.every = world, group, every
        # the ranks in `group` (`training.elastic`); None: every rank. The others' times are 0
        self.members: tuple[int, ...] | None = None
        self.unsent: list[tuple[StepRecord, int]] = []
        self.pending: list[tuple[list[tuple[StepRecord, int]], list[torch.Tensor], dist.Work]] = []
        self.kept: dict[int, list[float]] | None = None

    def post(self, rec: StepRecord, tag: int) -> None:
        """Queue `rec`'s compute time, with a tag that comes back with its row."""
        self.unsent.append((rec, tag))
        if len(self.unsent) >= self.every:
            self._send()

    def _send(self) -> None:
        mine = torch.tensor([rec.compute_s for rec, _ in self.unsent], dtype=torch.float64)
        out = [torch.zeros_like(mine) for _ in range(self.world)]
        into = out if self.members is None else [out[m] for m in self.members]
        work = dist.all_gather(into, mine, group=self.group, async_op=True)
        self.pending.append((self.unsent, out, work))
        self.unsent = []

    def wait_sent(self) -> None:
        """Wait until the newest gather is in: every rank has posted the step it carries."""
        if self.pending:
            self.pending[-1][2].wait()

    def collect(self, flush: bool = False) -> list[tuple[StepRecord, int, list[float]]]:
        """(record, tag, every rank's compute time) of the steps whose gather is in, oldest first;
        the newest gather stays in flight unless `flush`. Sets each record's idle_s and comm_s."""
        if flush and self.unsent:
            self._send()
        done = []
        while len(self.pending) > (0 if flush else 1):
            entries, out, work = self.pending.pop(0)
            work.wait()
            for (rec, tag), row in zip(entries, torch.stack(out, dim=1).tolist(), strict=True):
                rec.idle_s = min(max(row) - rec.compute_s, rec.wait_s)
                rec.comm_s = rec.wait_s - rec.idle_s
                done.append((rec, tag, row))
                if self.kept is not None:
                    self.kept[rec.step] = row
        return done

    def drop(self) -> list[tuple[StepRecord, int, list[float]]]:
        """Drop the unsent times and the gathers in flight (a peer was lost: they may never
        complete), first collecting those already complete without an error: their rows
        (kept, where `kept`) and records' split, as `collect` gives them."""
        pending, self.pending, self.unsent = self.pending, [], []
        done = []
        for gather in pending:
            if not gather[2].is_completed():
                continue
            try:
                gather[2].wait()
            except Exception:  # the lost peer's part never came: its rows are lost
                continue
            self.pending = [gather]
            done += self.collect(flush=True)
        return done


def column_means(rows: Sequence[Sequence[float]]) -> list[float]:
    """Per rank, the mean of its column over `rows[step][rank]`."""
    return [sum(col) / len(col) for col in zip(*rows, strict=True)]


def step_spread(rows: Sequence[Sequence[float]], plan: Sequence[int]) -> float:
    """The coefficient of variation, over `rows[step][rank]`, of each step's slowest compute
    time among the ranks `plan` gives samples: the noise a re-plan's gain must beat.

    >>> round(step_spread([[0.1, 0.2], [0.1, 0.22], [0.3, 0.18]], [8, 8]), 3)
    0.22
    >>> round(step_spread([[0.1, 0.2], [0.1, 0.22], [0.3, 0.18]], [8, 0]), 3)  # rank 1 left out
    0.693
    """
    slowest = [max((t for t, b in zip(row, plan, strict=True) if b), default=0.0) for row in rows]
    return relative_spread(slowest)


def mean_step(rows: Sequence[Sequence[float]], plan: Sequence[int]) -> float:
    """The mean, over `rows[step][rank]`, of each step's slowest compute time among the ranks
    `plan` gives samples: what the plan's steps cost, noise included.

    >>> round(mean_step([[0.1, 0.2], [0.3, 0.18]], [8, 8]), 3)
    0.25
    """
    slowest = [max((t for t, b in zip(row, plan, strict=True) if b), default=0.0) for row in rows]
    return sum(slowest) / len(slowest) if slowest else 0.0
