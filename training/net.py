"""What one rank trains: the model under DDP with the plan's comm hook, the optimizer, the
re-balancer it starts from, and the emulated stragglers' slowdown."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP

from hetflow.emulation.emulator import Emulator
from hetflow.training.comm import register_compression, wrap_optimizer
from hetflow.training.data import RankData
from hetflow.training.job import RunSpec
from hetflow.training.models import build_model
from hetflow.training.scheduler import Rebalancer


def straggler_factor(stragglers: list[tuple[int, int, float]], rank: int, step: int) -> float:
    """The factor on `rank`'s slowdown at `step`: that of the last (rank, onset, factor) entry
    for this rank whose onset has come, in the order listed; 1.0 before any."""
    factor = 1.0
    for r, at, f in stragglers:
        if r == rank and step >= at:
            factor = f
    return factor


@dataclass
class Net:
    """The model, DDP over it with the comm hook, the optimizer, and the hook's state."""

    model: nn.Module
    ddp: DDP
    opt: torch.optim.Optimizer
    hook_state: Any


def build_net(spec: RunSpec, data: RankData, emu: Emulator) -> Net:
    """The model at the run's seed, DDP with the plan's comm hook (its compute phase dilated by
    `emu`), and the configured optimizer wrapped as the hook needs."""
    cfg = spec.train
    model = build_model(cfg.model, data.manifest.features, data.manifest.classes, cfg.seed)
    # Gradients live in DDP's buckets: no copy between them each step, a copy that a worker's
    # compute phase would otherwise pay (and the emulator dilate).
    ddp = DDP(model, gradient_as_bucket_view=True)
    hook_state = register_compression(ddp, spec.plan.compression, emu.dilating_hook)
    if cfg.optimizer == "sgd":
        opt = torch.optim.SGD(ddp.parameters(), lr=cfg.lr, momentum=cfg.momentum)
    else:
        opt = torch.optim.Adam(ddp.parameters(), lr=cfg.lr)
    opt = wrap_optimizer(opt, spec.plan.compression, hook_state)
    return Net(model, ddp, opt, hook_state)


def new_rebalancer(spec: RunSpec, world: int) -> Rebalancer:
    """A re-balancer that starts from the plan's step model and the workers' memory caps."""
    cfg, plan = spec.train, spec.plan
    caps = [w.memory_cap_batch for w in spec.cluster.workers]
    latency = list(plan.latency_s) or [0.0] * world
    return Rebalancer(
        cfg.global_batch,
        caps,
        latency,
        list(plan.per_sample_s) or None,
        threshold=cfg.rebalance_threshold,
    )


def evaluate(model: nn.Module, batches: Iterable[tuple[np.ndarray, np.ndarray]]) -> float:
    """Accuracy of `model` over numpy (x, y) batches, in eval mode; the model is left in train
    mode."""
    model.eval()
    right = total = 0
    with torch.no_grad():
        for x, y in batches:
            right += int((model(torch.from_numpy(x)).argmax(1) == torch.from_numpy(y)).sum())
            total += len(y)
    model.train()
    return right / total if total else 0.0
