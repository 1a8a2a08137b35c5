"""The ranks a plan gives samples to, and the process group their gradient all-reduce runs on,
so that a rank the plan leaves out (batch 0) leaves the all-reduce too."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import timedelta

import torch
import torch.distributed as dist

from hetflow.training.comm import GroupRef


class ComputingRanks:
    """The ranks that compute under the plan in force (`ranks`), and the group the gradient's
    all-reduce runs on (`group`: None for every rank).

    It starts with every rank. When the plan in force leaves ranks out (`follow`, which the
    loop calls after every step), the all-reduce moves to a group of the others: a rank left
    out joins no collective of the gradient's, and its model and optimizer stand still. An
    all-reduce over fewer gloo processes is shorter (docs/measurements/host.md), and with a
    left-out rank in it the computing ranks waited for a rank that adds nothing.
    Every rank must call `follow` with the same plan at the same step: a new group is a
    collective of every rank (one per set of ranks, kept for the run). Its collectives time out
    after `timeout_s` (the run's `stall_timeout_s`; `faults.guard.bound_collectives` bounds only the
    groups that exist when the loop starts).

    Before a left-out rank computes again, before rank 0 evaluates or checkpoints while it is
    left out, and at the run's end, `sync_replicas` gives every rank the computing ranks' model
    and optimizer.

    Ranks leave only where nothing else needs every rank in each step (`can_leave`): a comm hook
    with no state kept between steps (`GroupRef`: none, fp16, bf16; PowerSGD's factors and
    top-k's residuals would go stale on a rank left out), DDP broadcasting no buffers (it
    broadcasts a model's buffers over every rank in each forward), and step times shared every
    step (the dynamic schedule: the left-out rank's step ends when the others' gather of that
    step's times comes in). Otherwise a rank left out joins the all-reduce with an empty batch,
    as torch's `Join` context manager has ranks that ran out of data shadow the collectives;
    torch offers no way to run a DDP step on a subset of its ranks, hence this class.
    """

    def __init__(
        self, world: int, rank: int, can_leave: bool, timeout_s: float | None = None
    ) -> None:
        self.world, self.rank, self.can_leave, self.timeout_s = world, rank, can_leave, timeout_s
        self.ranks: tuple[int, ...] = tuple(range(world))
        self.group = None
        self._groups: dict[tuple[int, ...], object] = {}

    @property
    def size(self) -> int:
        return len(self.ranks)

    @property
    def computes(self) -> bool:
        """Whether this rank is in the all-reduce (has samples, or joins with none)."""
        return self.rank in self.ranks

    @property
    def left_out(self) -> tuple[int, ...]:
        """The ranks out of the all-reduce, in order (none where every rank computes)."""
        return tuple(r for r in range(self.world) if r not in self.ranks)

    def follow(self, plan: Sequence[int], ready: bool = True) -> int | None:
        """Move the all-reduce to the ranks `plan` gives samples to (every rank where ranks
        cannot leave, or not `ready`: DDP has not yet rebuilt its buckets, which broadcasts
        their order over every rank in its second forward). Returns the rank whose replica
        every rank must take (`sync_replicas`) because a rank left out computes again: the
        lowest of the ranks that computed until now; None when none returns."""
        leave = self.can_leave and ready
        new = tuple(r for r, b in enumerate(plan) if b > 0) if leave else tuple(range(self.world))
        if not new:
            raise ValueError(f"plan {list(plan)}: no rank computes")
        if new == self.ranks:
            return None
        old, self.ranks = self.ranks, new
        if len(new) == self.world:
            self.group = None
        else:
            if new not in self._groups:
                timeout = None if self.timeout_s is None else timedelta(seconds=self.timeout_s)
                self._groups[new] = dist.new_group(list(new), timeout=timeout)
            self.group = self._groups[new]
        return old[0] if any(r not in old for r in new) else None


def can_leave(net, every: int) -> bool:
    """Whether ranks a plan leaves out can leave the all-reduce of `net` (a `Net`) when step
    times go out every `every` steps (see `ComputingRanks`)."""
    stateless = isinstance(net.hook_state, GroupRef)
    return stateless and not net.ddp.will_sync_module_buffers() and every == 1


def sync_replicas(net, amp, mean, src: int, **also) -> dict:
    """Every rank's model, optimizer state, loss scale and expected count
    (`MeanOverCounts.expected`) made those of rank `src`: a broadcast over every rank, each of
    which must call it. Returns rank `src`'s `also` (what else the caller's ranks must share).
    The model's tensors go as they lie (on the device); the rest as one pickled object. Its
    bytes are not counted as the gradient's (`WireCounter` counts all-reduce and all-gather)."""
    with torch.no_grad():
        for tensor in net.model.state_dict().values():
            dist.broadcast(tensor, src)
    rest = {"optimizer": net.opt.state_dict(), "scaler": amp.state_dict(), "n": mean.expected}
    box = [{**rest, "also": also}]
    dist.broadcast_object_list(box, src)
    if dist.get_rank() != src:
        net.opt.load_state_dict(box[0]["optimizer"])
        amp.load_state_dict(box[0]["scaler"])
        mean.expected = box[0]["n"]
    return box[0]["also"]
