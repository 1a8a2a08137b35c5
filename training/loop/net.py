"""What one rank trains: the recipe's model under DDP with the plan's comm hook (or sharded:
`training.loop.sharded`), and the optimizer (`build_net`), as one `Net` the loop's components
share: the stepper's passes, the checkpointer's state, the evaluator's model."""

from __future__ import annotations

from collections.abc import Callable
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass, field
from functools import partial
from typing import Any

import torch
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP

from hetflow.emulation.emulator import Emulator
from hetflow.infra.data.reader import RankData
from hetflow.records import CompressionMethod
from hetflow.training.comm import register_compression, wrap_optimizer
from hetflow.training.launch.spec import RunSpec
from hetflow.training.loop import sharded
from hetflow.training.loop.micro import micro_caps, splits
from hetflow.training.loop.optim import build_optimizer, resolve_optimizer
from hetflow.training.recipes import DataInfo, Recipe, check_fits, seed_rank, seeded_model


@dataclass
class Net:
    """The model, what a step calls (`ddp`), the optimizer and the comm hook's state, on
    `device`. Under `strategy` 'ddp', `ddp` is DDP over `model` with the comm hook; under
    'fsdp' it is `model` itself, sharded in place (`training.loop.sharded`), and `hook_state`
    is None. `plain` (fsdp) builds an unsharded copy of the model for rank 0's evaluation;
    `caps` (fsdp, `train.accumulate` 'auto') every rank's largest micro-batch (`micro_caps`),
    which tell each step whether any rank's share splits (`step_context`)."""

    model: nn.Module
    ddp: nn.Module
    opt: torch.optim.Optimizer
    hook_state: Any
    device: str = "cpu"
    strategy: str = "ddp"
    plain: Callable[[], nn.Module] | None = None
    caps: list[int | None] | None = None
    _copy: nn.Module | None = field(default=None, init=False, repr=False)

    @property
    def sharded(self) -> bool:
        return self.strategy == "fsdp"

    def step_context(self, plan: list[int]) -> AbstractContextManager:
        """What a step on the local batches `plan` runs in: under fsdp, where any rank's share
        splits into micro-batches, every rank's units stay gathered for the step
        (`sharded.gathered`; the plan is the same on every rank, so all enter it alike);
        otherwise nothing."""
        if self.sharded and self.caps and any(map(splits, plan, self.caps)):
            return sharded.gathered(self.model)
        return nullcontext()

    def no_sync(self) -> AbstractContextManager:
        """A micro-batch's forward and backward but the last: gradients accumulate locally,
        no collective (DDP's `no_sync`; fsdp: `sharded.no_sync`)."""
        return sharded.no_sync(self.model) if self.sharded else self.ddp.no_sync()

    def full_state(self) -> tuple[dict, dict]:
        """(model, optimizer) state dicts, full, on rank 0 (the exported model). Under fsdp
        gathered from every rank's shards: a collective every rank calls."""
        if self.sharded:
            return sharded.full_state(self.model, self.opt)
        return self.model.state_dict(), self.opt.state_dict()

    def checkpoint_state(self, shards: str | None) -> tuple[dict, dict]:
        """(model, optimizer) state dicts for rank 0's checkpoint. Under fsdp every rank
        writes its shards into the folder `shards` instead (`sharded.save_shards`, a
        collective) and both dicts are empty."""
        if self.sharded:
            sharded.save_shards(self.model, self.opt, shards)
            return {}, {}
        return self.full_state()

    def load_state(self, model_state: dict, opt_state: dict, shards: str | None) -> None:
        """A checkpoint's state loaded on every rank: under fsdp from its DCP folder `shards`
        (re-sharded onto this run's ranks), under DDP from the full dicts."""
        if self.sharded:
            sharded.load_shards(self.model, self.opt, shards)
        else:
            self.model.load_state_dict(model_state)
            self.opt.load_state_dict(opt_state)

    def evaluation_model(self, rank: int) -> nn.Module | None:
        """The model rank 0 evaluates (None on the other ranks): `model` under DDP; under
        fsdp an unsharded copy loaded with the weights gathered from every rank (every rank
        calls it)."""
        if not self.sharded:
            return self.model if rank == 0 else None
        weights, _ = sharded.full_state(self.model, self.opt)
        if rank != 0:
            return None
        if self._copy is None:  # built once, on rank 0 only
            self._copy = self.plain().to(self.device)
        self._copy.load_state_dict(weights)
        return self._copy

    def state_bytes(self) -> int:
        """Bytes of parameters, gradients and optimizer state this rank holds
        (`sharded.state_bytes`: its shards under fsdp)."""
        return sharded.state_bytes(self.model, self.opt)


def build_net(
    spec: RunSpec,
    data: RankData,
    emu: Emulator,
    recipe: Recipe,
    device: str = "cpu",
    method: CompressionMethod | None = None,
    *,
    rank: int,
    **warmup,
) -> Net:
    """The recipe's model at the run's seed on `device`, DDP with the comm hook of `method`
    (default: the plan's; its compute phase dilated by `emu`; `warmup`: `warmup_steps` and
    `density_stage_steps` of `register_compression`), and the configured optimizer wrapped as
    the hook needs: parameters, gradients and optimizer state all on `device`. Under
    `train.strategy` 'fsdp' the model is sharded instead (`sharded.shard_model` over the
    recipe's `shard_units`), with no comm hook, and the compute phase ends where the optimizer
    steps (`training.loop.sharded` says what else differs). Seeds torch's generators: the
    run's seed for the weights (`seeded_model`: the same on every rank), then (seed, `rank`)'s
    for what the rank draws in training (`seed_rank`: its own dropout masks)."""
    cfg = spec.train
    method = spec.plan.compression if method is None else method
    info = DataInfo.from_manifest(data.manifest)
    check_fits(recipe, info, data.manifest.url)
    model = seeded_model(recipe, info, cfg.seed).to(device)
    seed_rank(cfg.seed, rank)
    if cfg.strategy == "fsdp":
        model = sharded.shard_model(model, recipe.shard_units(model))
        opt = build_optimizer(model, resolve_optimizer(cfg, recipe))
        sharded.end_phase_at_step(opt, emu)
        plain = partial(seeded_model, recipe, info, cfg.seed)
        caps = micro_caps(spec)
        return Net(model, model, opt, None, device, strategy="fsdp", plain=plain, caps=caps)
    # Gradients live in DDP's buckets: no copy between them each step, a copy that a worker's
    # compute phase would otherwise pay (and the emulator dilate).
    ids = [torch.device(device)] if device != "cpu" else None
    ddp = DDP(model, device_ids=ids, gradient_as_bucket_view=True)
    nodes = [w.node for w in spec.cluster.workers]  # hierarchical averaging groups by node
    hook_state = register_compression(ddp, method, emu.dilating_hook, nodes=nodes, **warmup)
    opt = build_optimizer(ddp.module, resolve_optimizer(cfg, recipe))
    opt = wrap_optimizer(opt, method, hook_state)
    return Net(model, ddp, opt, hook_state, device)
