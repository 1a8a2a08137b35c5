"""A request from outside the run to end it at a checkpoint, agreed at the same step by every
rank (`StopRequest`): how the queue stops a job to move its workers or to cancel it.

The request names a step; a process outside the run writes it at any time through the run's
`StopChannel` (`stop_channel`: the file `RUN_DIR/stop_at` on the local launcher, the Ray
cluster's board on the Ray launcher), which this module reads without knowing which. Ranks
that each read the request themselves at a boundary could read it on either side of that
write: one ends the run there, another goes on into the
next step's collectives alone and waits in them until the stall timeout ends the job (seen
with steps of a few milliseconds, where the ranks pass a boundary between the queue's read of
progress.json and its write). So rank 0 alone reads the channel (under `on_loss: continue`,
the lowest rank still in the job, rank 0 having perhaps left it), before each step, and publishes
the step every rank stops at in torchrun's store, as a SIGTERM's is (`faults.guard.Preemption`):
the first checkpoint at or after the step the request names that lies at least `slack` steps past
rank 0's next boundary. No rank has asked about that boundary yet: a rank cannot finish a step
before rank 0 has joined that step's all-reduce, which it does after publishing (`slack` is
Preemption's: 1, or a local-SGD period more). The other ranks read the store at each
checkpoint boundary: one round trip every `checkpoint_every` steps.
"""

from __future__ import annotations

from pathlib import Path

import torch.distributed as dist

from hetflow.training.elastic.world import current
from hetflow.training.faults.records import attempt
from hetflow.training.loop.stop_channel import FileStopChannel, StopChannel


def stop_step(wanted: int, boundary: int, every: int, slack: int) -> int:
    """The checkpoint (a multiple of `every`) a run stops at, asked for `wanted` while rank 0
    is before its step to `boundary`: the first at `wanted` or after it, and at least `slack`
    past `boundary`.

    >>> stop_step(112, 112, 4, 1)  # a rank may have asked about 112 already
    116
    >>> stop_step(120, 112, 4, 1)
    120
    """
    least = max(wanted, boundary + slack)
    return -(-least // every) * every


def leader() -> int:
    """The rank that reads the request: 0, or the current elastic generation's lowest."""
    world = current()
    return 0 if world is None else world.leader


class StopRequest:
    """The run's stop request on one rank (see the module). `asked(boundary)` is called by
    every rank before each step, with the boundary that step reaches, in order. `channel`:
    where rank 0 reads the request (a run directory: its file); `store`: the store the
    ranks share, default the process group's (torchrun's, Ray Train's)."""

    KEY = "stop_at"

    def __init__(
        self, channel: StopChannel | str | Path, rank: int, every: int, slack: int, store=None
    ) -> None:
        if store is None:
            from torch.distributed.distributed_c10d import _get_default_store

            store = _get_default_store()
        self.store = dist.PrefixStore(f"hetflow/queue_stop_{attempt()}/", store)
        if not isinstance(channel, StopChannel):
            channel = FileStopChannel(channel)
        self.channel = channel
        self.rank, self.every, self.slack = rank, every, slack
        self.stop_at: int | None = None

    def asked(self, boundary: int) -> bool:
        """Whether the run ends at `boundary` (steps done), a checkpoint: the same answer on
        every rank."""
        if self.rank == leader():
            self.channel.report(boundary)
            if self.stop_at is None:
                self.publish(boundary)
        if boundary % self.every:
            return False
        if self.stop_at is None and self.store.check([self.KEY]):
            self.stop_at = int(self.store.get(self.KEY))
        return self.stop_at == boundary

    def publish(self, boundary: int) -> None:
        """Rank 0: the channel's request, if there is one, as the step every rank stops at."""
        wanted = self.channel.read()
        if wanted is None:
            return
        self.stop_at = stop_step(wanted, boundary, self.every, self.slack)
        self.store.set(self.KEY, str(self.stop_at))
