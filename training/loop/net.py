"""What one rank trains, as one `Net` the loop's components share (the stepper's passes, the
checkpointer's state, the evaluator's model): the model, what a step calls, the optimizer and
the comm hook's state. Each strategy builds its own (`training.loop.strategies`): `Net` is the
replicated model every rank holds whole (`ddp`: `build_net`, DDP with the plan's comm hook;
`diloco`: `rounds.build_round_net`); `fsdp.ShardedNet` overrides what a sharded model does
otherwise."""

from __future__ import annotations

from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP

from hetflow.infra.data.reader import RankData
from hetflow.records import CompressionMethod
from hetflow.training.comm import register_compression, wrap_optimizer
from hetflow.training.elastic.world import elastic_group
from hetflow.training.hooks import PhaseClock
from hetflow.training.launch.spec import RunSpec
from hetflow.training.loop.optim import build_optimizer
from hetflow.training.loop.sharded import state_bytes
from hetflow.training.recipes import DataInfo, Recipe, check_fits, seed_rank, seeded_model


@dataclass
class Net:
    """The model, what a step calls (`ddp`), the optimizer and the comm hook's state, on
    `device`, for a model every rank holds whole: `ddp` is DDP over `model` with the comm hook
    (`ddp`), or `model` itself (`diloco`, no hook: `hook_state` None). Its state is the full
    state dicts, which rank 0 checkpoints and evaluates; a sharded model answers the same
    questions otherwise (`fsdp.ShardedNet`)."""

    model: nn.Module
    ddp: nn.Module
    opt: torch.optim.Optimizer
    hook_state: Any
    device: str = "cpu"

    # whether every rank writes its shards into the checkpoint (else rank 0 the full dicts)
    sharded = False
    # whether a pass on the bare model runs without collectives (`Stepper.warm_up`)
    warms_up = True

    def step_context(self, plan: list[int]) -> AbstractContextManager:
        """What a step on the local batches `plan` runs in: nothing for a whole model."""
        return nullcontext()

    def no_sync(self) -> AbstractContextManager:
        """A micro-batch's forward and backward but the last: gradients accumulate locally,
        no collective (DDP's `no_sync`)."""
        return self.ddp.no_sync()

    def full_state(self) -> tuple[dict, dict]:
        """(model, optimizer) state dicts, full, on rank 0 (the exported model)."""
        return self.model.state_dict(), self.opt.state_dict()

    def weights(self) -> dict[str, torch.Tensor]:
        """The model's full state dict on rank 0 (every rank calls it)."""
        return self.model.state_dict()

    def checkpoint_state(self, shards: str | None) -> tuple[dict, dict]:
        """(model, optimizer) state dicts for rank 0's checkpoint (`shards` unused)."""
        return self.full_state()

    def load_state(self, model_state: dict, opt_state: dict, shards: str | None) -> None:
        """A checkpoint's full state dicts loaded on every rank (`shards` unused)."""
        self.model.load_state_dict(model_state)
        self.opt.load_state_dict(opt_state)

    def evaluation_model(self, rank: int) -> nn.Module | None:
        """The model rank 0 evaluates (None on the other ranks)."""
        return self.model if rank == 0 else None

    def state_bytes(self) -> int:
        """Bytes of parameters, gradients and optimizer state this rank holds
        (`sharded.state_bytes`)."""
        return state_bytes(self.model, self.opt)


def build_net(
    spec: RunSpec,
    data: RankData,
    emu: PhaseClock,
    recipe: Recipe,
    device: str = "cpu",
    method: CompressionMethod | None = None,
    *,
    rank: int,
    **warmup,
) -> Net:
    """`strategy: ddp`: the recipe's model (`replica`) under DDP with the comm hook of `method`
    (default: the plan's; its compute phase ended by `emu`'s `dilating_hook`; `warmup`:
    `warmup_steps` and `density_stage_steps` of `register_compression`), and the configured
    optimizer wrapped as the hook needs: parameters, gradients and optimizer state all on
    `device`."""
    cfg = spec.train
    method = spec.plan.compression if method is None else method
    model = replica(spec, data, recipe, device, rank)
    # Gradients live in DDP's buckets: no copy between them each step, a copy that a worker's
    # compute phase would otherwise pay (and the emulator dilate).
    ids = [torch.device(device)] if device != "cpu" else None
    # under `on_loss: continue`, on the generation's group (some slots of the world not started)
    ddp = DDP(model, device_ids=ids, process_group=elastic_group(), gradient_as_bucket_view=True)
    nodes = [w.node for w in spec.cluster.workers]  # hierarchical averaging groups by node
    hook_state = register_compression(ddp, method, emu.dilating_hook, nodes=nodes, **warmup)
    opt = build_optimizer(ddp.module, cfg)  # resolved before launch
    opt = wrap_optimizer(opt, method, hook_state)
    return Net(model, ddp, opt, hook_state, device)


def replica(spec: RunSpec, data: RankData, recipe: Recipe, device: str, rank: int) -> nn.Module:
    """The recipe's model at the run's seed on `device`, checked against the data first. Seeds
    torch's generators: the run's seed for the weights (`seeded_model`: the same on every rank),
    then (seed, `rank`)'s for what the rank draws in training (`seed_rank`: its own dropout
    masks). Every strategy starts from it."""
    info = DataInfo.from_manifest(data.manifest)
    check_fits(recipe, info, data.manifest.url)
    model = seeded_model(recipe, info, spec.train.seed).to(device)
    seed_rank(spec.train.seed, rank)
    return model
