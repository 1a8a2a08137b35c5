"""The training loop's membership of computing ranks: which ranks the gradient's all-reduce
runs on as the plan changes (`computing.ComputingRanks`), and every rank's replica made the
computing ranks' where one left out must hold it."""

from __future__ import annotations

from hetflow.training.devices import MixedPrecision
from hetflow.training.loop.computing import ComputingRanks, can_leave, sync_replicas
from hetflow.training.loop.net import Net
from hetflow.training.loop.state import LoopState
from hetflow.training.loop.weighting import MeanOverCounts


class Membership:
    """The ranks in the all-reduce of `net`'s gradient (`computing`: every rank at the start),
    kept in step with the plan in force after every step (`follow`), and the replicas synced
    before a left-out rank computes again, evaluates or checkpoints, and at the run's end
    (`refresh`). Ranks leave only where `computing.can_leave` (one of its conditions: step times
    shared every step, `every` 1); the groups' collectives time out after `timeout_s`. Every
    rank calls `follow` and `refresh` with the same arguments after the same step."""

    def __init__(
        self,
        world: int,
        rank: int,
        net: Net,
        amp: MixedPrecision,
        mean: MeanOverCounts,
        every: int,
        timeout_s: float | None,
    ) -> None:
        self.net = net
        self.amp = amp
        self.mean = mean
        self.computing = ComputingRanks(world, rank, can_leave(net, every), timeout_s=timeout_s)

    @property
    def computes(self) -> bool:
        """Whether this rank is in the all-reduce this step (`ComputingRanks.computes`)."""
        return self.computing.computes

    def follow(self, state: LoopState, first: int) -> None:
        """Run the gradient's all-reduce from step `first` on the ranks the plan in force
        (`state.plan`) gives samples to, where ranks can leave it (`ComputingRanks`); a rank
        that returns to it takes the others' replica first. Ranks leave it once DDP has rebuilt
        its buckets (its second forward in this process); a plan the run started on leaves them
        then."""
        if not self.computing.can_leave:
            return
        src = self.computing.follow(state.plan, ready=first - state.start >= 2)
        self.net.hook_state.group = self.computing.group
        self.mean.world = self.computing.size
        if src is not None:
            self.sync_from(src, state)

    def refresh(self, state: LoopState, rank0: bool, everyone: bool) -> None:
        """Where ranks are out of the all-reduce, their replicas stood still: made the computing
        ranks' when `rank0` and rank 0 is out (it evaluates or checkpoints next), or when
        `everyone` (the run's end: every rank ends with the same weights)."""
        out = self.computing.left_out
        if out and (everyone or (rank0 and out[0] == 0)):
            self.sync_from(self.computing.ranks[0], state)

    def sync_from(self, src: int, state: LoopState) -> None:
        """Every rank's replica (model, optimizer, loss scale) made rank `src`'s
        (`sync_replicas`; every rank calls it); rank 0's training time too, which its
        evaluations are stamped with."""
        theirs = sync_replicas(self.net, self.amp, self.mean, src, train_time_s=state.train_time_s)
        state.train_time_s = theirs["train_time_s"]
