"""One rank's step (`Stepper`): forward and backward (one pass, or one per micro-batch), the
loss weighted over the global batch, the comm hook's collectives and the optimizer's step, on
the run's `Net`; and the untimed warm-up pass before the first."""

from __future__ import annotations

from contextlib import nullcontext
from dataclasses import dataclass

import torch

from hetflow.training.comm import local_averager
from hetflow.training.hooks import PhaseClock
from hetflow.training.loop.micro import split_batch
from hetflow.training.loop.net import Net
from hetflow.training.loop.weighting import MeanOverCounts
from hetflow.training.recipes import Recipe


@dataclass
class Stepper:
    """One rank's step under `ddp` or `fsdp` (`strategies.replica_stepper`), on what stays
    fixed for a run (or one trial): the model (`net`), its compute-phase clock (`PhaseClock`:
    the worker's emulator), the loss's mean over counts, the precision (`MixedPrecision`), the
    wire counter (`WireCounter`) and the recipe; `cap`: the largest micro-batch (`micro_cap`;
    None: a share runs in one pass)."""

    net: Net
    emu: PhaseClock
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
