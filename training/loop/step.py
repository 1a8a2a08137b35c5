"""What one rank trains: the recipe's model under DDP with the plan's comm hook (or sharded:
`training.loop.sharded`), the optimizer, the weighting of each rank's summed loss
(`MeanOverCounts`), and the emulated stragglers' slowdown."""

from __future__ import annotations

from collections.abc import Callable
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass, field
from functools import partial
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP

from hetflow.emulation.emulator import Emulator
from hetflow.infra.data.reader import RankData
from hetflow.records import CompressionMethod
from hetflow.training.comm import local_averager, register_compression, wrap_optimizer
from hetflow.training.launch.spec import RunSpec
from hetflow.training.loop import sharded
from hetflow.training.loop.optim import build_optimizer, resolve_optimizer
from hetflow.training.plan.balance import micro_split
from hetflow.training.recipes import DataInfo, Recipe, check_fits, seed_rank, seeded_model


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


@dataclass
class Stepper:
    """One rank's step, on what stays fixed for a run (or one trial): the model (`net`), its
    emulator, the loss's mean over counts, the precision (`MixedPrecision`), the wire counter
    (`WireCounter`) and the recipe; `cap`: the largest micro-batch (`micro_cap`; None: a share
    runs in one pass)."""

    net: Net
    emu: Emulator
    mean: MeanOverCounts
    amp: object
    counter: object
    recipe: Recipe
    cap: int | None = None

    def step(self, batch, n: int, plan: list[int]) -> tuple[torch.Tensor, int, float]:
        """One step on a batch of `n` samples already on the device, this rank's share of the
        local batches `plan`: forward, backward and the comm hook up to its last bucket (a
        compute phase of `emu`, keyed by `n`, which the hook ends), the collectives (each
        carried by the emulated link where DDP issued it, when one is attached to the counter)
        and the optimizer's step through `amp`. Returns (this rank's summed loss, what it sums
        over, the bytes the counter charged since its last `take`).

        A share past `cap` runs as micro-batches (`split_batch`), their gradients accumulated
        (`accumulate`): one all-reduce per step whatever their count; under fsdp one
        all-gather and one reduce-scatter per unit, in a step run in `Net.step_context`."""
        with self.net.step_context(plan):
            return self.passes(batch, n, plan)

    def passes(self, batch, n: int, plan: list[int]) -> tuple[torch.Tensor, int, float]:
        """`step`'s forward and backward passes (one, or one per micro-batch) and the rest."""
        net, amp = self.net, self.amp
        averager = local_averager(net.opt)  # local SGD, hierarchical averaging
        parts = split_batch(batch, n, self.cap)
        if len(parts) > 1:
            if averager is not None:  # train.check_job refuses the combination before launch
                raise ValueError("train.accumulate: 'auto' cannot run with local SGD")
            loss_sum, count = self.accumulate(parts, plan)
            return self.finish(loss_sum, count, n, plan, None, accumulated=True)
        self.emu.start(key=n)
        with amp.autocast():
            loss_sum, count = self.recipe.loss(net.ddp, batch)
        count = int(count)
        return self.finish(loss_sum, count, n, plan, averager)

    def accumulate(self, parts: list[tuple], plan: list[int]) -> tuple[torch.Tensor, int]:
        """Forward and backward of each micro-batch of `parts`, their gradients summed in
        place: under `Net.no_sync()` but the last, so that DDP's all-reduce (and the comm
        hook, which ends the emulator's phase) runs once, on the last backward, on the sum; on
        every rank one per step, whatever its count, so the counts may differ between ranks.
        Under fsdp the same holds for the reduce-scatters, and the all-gathers are one per unit
        in the step's first forward (`sharded.gathered`, entered by `step`); the last phase
        ends when the optimizer steps (`sharded.end_phase_at_step`). Each micro-batch is an
        emulated compute phase of its own, keyed by its size: the step's compute is the sum of
        the dilated micro-steps, each paying the device's per-pass cost as a real device does.
        `MeanOverCounts` weights each micro-batch's summed loss as a whole share's. Returns
        (the summed loss, its count)."""
        net, amp, emu = self.net, self.amp, self.emu
        total_loss, total = None, 0
        for j, part in enumerate(parts):
            last = j == len(parts) - 1
            size = len(part[0])
            emu.start(key=size)
            with nullcontext() if last else net.no_sync():
                with amp.autocast():
                    loss_sum, count = self.recipe.loss(net.ddp, part)
                total += int(count)
                self.mean.backward(
                    loss_sum, int(count), size, sum(plan), amp.scale, last=last, total=total
                )
            if not last:
                emu.finish()  # the last one's: the comm hook (fsdp: the optimizer's step)
            summed = loss_sum.detach().float()
            total_loss = summed if total_loss is None else total_loss + summed
        return total_loss, total

    def finish(
        self, loss_sum, count: int, n: int, plan: list[int], averager, accumulated: bool = False
    ) -> tuple[torch.Tensor, int, float]:
        """The rest of a step once its forward pass is done: its backward (not where the
        micro-batches' ran, `accumulated`), the gradient's correction to this step's count,
        the optimizer's step; (summed loss, count, bytes the counter charged)."""
        net, amp = self.net, self.amp
        if averager is not None and averager.local():
            # no all-reduce over every rank: the rank (node) steps on its own mean, and the
            # averager weights its replica by its samples (`SampleWeightedAverager`); every
            # rank is past the warm-up at the same step, so none waits for the count's
            self.mean.check(count, n)
            amp.scale(loss_sum * averager.loss_scale(count, plan)).backward()
        else:
            # DDP averages over ranks: weighted so that the result is the mean over the global
            # batch's counts (samples, or tokens); times the shared loss scale where one is used
            if not accumulated:
                self.mean.backward(loss_sum, count, n, sum(plan), amp.scale)
            self.mean.correct(net.model)
        if averager is not None:
            averager.trained(n, sum(plan))
        amp.step(net.opt)
        net.opt.zero_grad(set_to_none=True)
        nbytes, _ = self.counter.take()
        return loss_sum, count, nbytes

    def warm_up(self, batch) -> None:
        """One forward and backward pass on `batch`, untimed and without effect on the run: on
        the bare model (no collective, no comm hook, no emulated dilation), its gradients
        dropped, its buffers (BatchNorm's statistics) and the RNGs put back. Every variant runs
        it before its first timed step, so that none pays a cold first step (kernels chosen
        and compiled, the allocator's first blocks) that another has already paid."""
        model = self.net.model
        buffers = {k: v.detach().clone() for k, v in model.named_buffers()}
        cuda = self.net.device.startswith("cuda")
        rng = torch.get_rng_state(), torch.cuda.get_rng_state_all() if cuda else None
        with self.amp.autocast():
            loss_sum, _ = self.recipe.loss(model, batch)
        loss_sum.float().backward()
        model.zero_grad(set_to_none=True)
        with torch.no_grad():
            for k, v in model.named_buffers():
                v.copy_(buffers[k])
        torch.set_rng_state(rng[0])
        if cuda:
            torch.cuda.set_rng_state_all(rng[1])
            torch.cuda.synchronize()


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
