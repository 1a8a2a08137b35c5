"""The training loop's checkpointer: the store's newest checkpoint read once at the start
(`Checkpointer.saved`), loaded into what the run trains (`resume`), and the run saved every
`checkpoint_every` steps (`save`). The store's layout is `checkpoint.CheckpointStore`'s, a
checkpoint's contents `state.Checkpoint`'s."""

from __future__ import annotations

from dataclasses import dataclass

import torch.distributed as dist

from hetflow.records import CompressionTrials
from hetflow.training.comm import comm_state_dict, load_comm_state
from hetflow.training.devices import MixedPrecision
from hetflow.training.launch.spec import RunSpec
from hetflow.training.loop.checkpoint_store import CheckpointStore
from hetflow.training.loop.net import Net
from hetflow.training.loop.state import Checkpoint, LoopState
from hetflow.training.plan.rebalancer import Rebalancer


@dataclass
class CheckpointParts:
    """What a checkpoint holds besides the loop's state: the model and optimizer (`net`, with
    its comm hook's state), the loss scale (`amp`), the re-balancer, the lr scheduler and
    'auto''s trials."""

    net: Net
    amp: MixedPrecision
    rebalancer: Rebalancer
    lr_schedule: object
    trials: CompressionTrials | None


class Checkpointer:
    """The run's checkpoints in its store (`spec.checkpoint_url`, else the run directory's
    checkpoints/). Built before the rest of the run (the trials read `saved.trials`); `resume`
    then names what it loads and saves (`CheckpointParts`) and lets go of the checkpoint read.
    Rank 0 alone writes the checkpoint (under fsdp every rank writes its shards first)."""

    def __init__(self, spec: RunSpec, rank: int, world: int) -> None:
        self.rank = rank
        self.world = world
        self.workers = [w.name for w in spec.cluster.workers]
        self.plan = list(spec.plan.local_batches)
        self.strategy = spec.train.strategy
        self.store = CheckpointStore(spec.checkpoint_url or f"{spec.run_dir}/checkpoints")
        self.saved = self.on_these_workers(self.store.load())
        self.parts: CheckpointParts | None = None

    def on_these_workers(self, saved: dict | None) -> Checkpoint | None:
        """The store's newest checkpoint `saved` for this run's workers: as saved where it was
        taken on them, else moved onto them with the spec's plan (`Checkpoint.moved`: the run
        went on without the workers of a lost node, or the queue gave the job others)."""
        if saved is None:
            return None
        ckpt = Checkpoint.from_dict(saved, self.workers)
        if ckpt.workers == self.workers:
            return ckpt
        if self.rank == 0:
            print(
                f"rank 0: resuming step {ckpt.step} of {ckpt.workers} on {self.workers}, "
                f"local batches {self.plan}",
                flush=True,
            )
        return ckpt.moved(self.workers, self.plan)

    def resume(self, parts: CheckpointParts) -> LoopState:
        """The checkpoint read (`saved`, the store's newest) loaded into the model, optimizer,
        comm hook, loss scale, re-balancer and lr scheduler of `parts`, and the loop's state
        from it; a fresh state on the spec's plan when there is none. `parts` are what `save`
        saves from then on."""
        saved, self.saved, self.parts = self.saved, None, parts
        if saved is None:
            return LoopState.fresh(self.plan)
        saved.check_strategy(self.strategy)
        shards = self.store.at(saved.shards) if saved.shards else None
        parts.net.load_state(saved.model, saved.optimizer, shards)  # fsdp: re-sharded
        load_comm_state(parts.net.hook_state, saved.comm)
        parts.amp.load_state_dict(saved.scaler)
        if saved.rebalancer is not None:
            parts.rebalancer.restore(saved.rebalancer)
        if saved.scheduler is not None:
            parts.lr_schedule.load_state_dict(saved.scheduler)
        return LoopState.from_checkpoint(saved, self.rank)

    def save(self, step: int, state: LoopState) -> None:
        """Gather every rank's step records; rank 0 saves them with the model, optimizer, comm
        hook, re-balancer and loop `state`, as the checkpoint of `step` steps done. Every rank
        calls it."""
        everyone: list = [None] * self.world
        dist.all_gather_object(everyone, state.records)
        parts = self.parts
        net = parts.net
        shards = self.store.shards_name(step) if net.sharded else None
        model, optimizer = net.checkpoint_state(shards and self.store.at(shards))
        if self.rank == 0:
            ckpt = Checkpoint(
                step=step,
                workers=list(self.workers),
                model=model,
                optimizer=optimizer,
                strategy=self.strategy,
                shards=shards,
                plan=state.plan,
                plans=state.plans,
                evals=state.evals,
                train_time_s=state.train_time_s,
                rebalancer=parts.rebalancer.state(),
                comm=comm_state_dict(net.hook_state),
                trials=parts.trials,
                scaler=parts.amp.state_dict(),
                records=everyone,
                scheduler=parts.lr_schedule.state_dict(),
            )
            self.store.save(step, ckpt.to_dict(), shards)  # after every rank's shards
