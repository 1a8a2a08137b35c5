"""`strategy: diloco`'s builders: the model with no DDP (no gradient all-reduce), its own
inner optimizer wrapped with the outer step (`RoundOptimizer`), and one loop step as one round
(`RoundStepper`): this rank's share of the round as inner steps, a plain loop of them. The
outer step (`training.comm.outer.OuterStep`) is not in that loop: as torchft's `DiLoCo`
(`torchft/local_sgd.py`), it is a step post-hook on the inner optimizer, which takes it after
the round's last inner step (`RoundOptimizer.begin_round` says how many there are).

The loop's `TrainConfig` carries its rounds in fields of their own, derived before launch
(`training.plan.rounds.resolve_rounds`): `diloco.rounds` turns of the loop, each of
`diloco.round_samples` samples, in inner steps of `diloco.round_inner_batch` (the global batch
the user gave over the workers, unless `diloco.inner_batch` sets it).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.distributed as dist

from hetflow.infra.data.reader import RankData
from hetflow.training.comm.outer import OuterStep
from hetflow.training.hooks import PhaseClock
from hetflow.training.launch.spec import RunSpec
from hetflow.training.loop.micro import split_batch
from hetflow.training.loop.net import Net, replica
from hetflow.training.loop.optim import build_optimizer
from hetflow.training.loop.rank_step import Stepper
from hetflow.training.recipes import Recipe


def round_inner_batch(spec: RunSpec) -> int:
    """The inner batch of a diloco run, as derived before launch (`resolve_rounds`)."""
    if spec.train.diloco.round_inner_batch is None:
        raise ValueError("round_inner_batch: a diloco spec whose rounds are not derived")
    return spec.train.diloco.round_inner_batch


class RoundOptimizer(torch.optim.Optimizer):
    """This rank's inner optimizer (`optim`, stepped by every inner step) with the run's outer
    step (`outer`) beside it: its param groups are the inner one's (the lr scheduler acts on
    them), its state dict both, so a checkpoint resumes both; `averager` is what the loop's
    last step drains (`comm.finish_optimizer`: every rank ends on the same weights). Written
    as torch's `PostLocalSGDOptimizer` wraps its optimizer.

    The outer step hooks the inner optimizer's step (`_stepped`, a step post-hook, as torchft's
    `DiLoCo` does): it follows the round's last inner step. Every inner step steps (`diloco`
    refuses what would skip one: fp16's loss scale, `nonfinite: skip`), so the count is exact."""

    def __init__(self, optim: torch.optim.Optimizer, outer: OuterStep) -> None:
        self.optim, self.outer = optim, outer
        self.param_groups = optim.param_groups
        self.averager = _Drain(outer)
        self._left, self._weight = 0, 0.0  # the round's inner steps still to come, its weight
        optim.register_step_post_hook(self._stepped)

    def begin_round(self, inner_steps: int, weight: float) -> None:
        """This rank's next round: `inner_steps` inner steps, then the outer step with its
        `weight` (its samples over the round's: `OuterStep.end_round`). A rank with none (no
        samples this round) takes the outer step at once: every rank joins each round's."""
        if self._left:
            raise RuntimeError(f"a round begun with {self._left} inner steps of the last to go")
        self._left, self._weight = inner_steps, weight
        if inner_steps == 0:
            self.outer.end_round(weight)

    def _stepped(self, *_) -> None:
        """After each inner step: the outer step after the round's last."""
        if self._left == 0:
            return  # no round begun: a step of the optimizer alone
        self._left -= 1
        if self._left == 0:
            self.outer.end_round(self._weight)

    @property
    def state(self):  # type: ignore[override]
        return self.optim.state

    def step(self, closure=None):
        return self.optim.step(closure)

    def zero_grad(self, set_to_none: bool = True) -> None:
        self.optim.zero_grad(set_to_none=set_to_none)

    def state_dict(self) -> dict:
        return {"inner": self.optim.state_dict(), "outer": self.outer.state_dict()}

    def load_state_dict(self, state_dict: dict) -> None:
        self.optim.load_state_dict(state_dict["inner"])
        self.outer.load_state_dict(state_dict["outer"])


class _Drain:
    """The `averager` face of an `OuterStep` (`comm.local_averager`): `apart` while rounds are
    in flight, `average_now` applies them all."""

    def __init__(self, outer: OuterStep) -> None:
        self.outer = outer

    @property
    def apart(self) -> int:
        return self.outer.apart

    def average_now(self, params=None) -> None:
        self.outer.drain()


def build_round_net(
    spec: RunSpec, data: RankData, emu: PhaseClock, recipe: Recipe, device: str, *, rank: int
) -> Net:
    """The recipe's model (`net.replica`: the same weights on every rank, then the rank's own
    seed), no DDP; the configured optimizer (resolved before launch) at the inner batch's
    learning rate, with the outer step on a process group of its own (the run's backend), so
    that its asynchronous collectives queue behind nothing else (every rank builds it at the
    same point). `emu` is the stepper's: no comm hook ends a phase here."""
    cfg = spec.train
    model = replica(spec, data, recipe, device, rank)
    inner = cfg.model_copy(update={"global_batch": round_inner_batch(spec)})
    optim = build_optimizer(model, inner)
    group = dist.new_group()  # the run's backend: gloo on CPUs, NCCL where every rank has a GPU
    outer = OuterStep(list(model.parameters()), cfg.diloco, group=group)
    return Net(model, model, RoundOptimizer(optim, outer), None, device)


@dataclass
class RoundStepper:
    """One rank's round, on what stays fixed for a run: the model (`net`, from
    `build_round_net`), its emulator, the precision, the wire counter, the recipe and the
    inner batch. `cap` is None: a round's passes are inner steps, not micro-batches.
    `inner_steps`: how many the last round took."""

    net: Net
    emu: PhaseClock
    amp: object
    counter: object
    recipe: Recipe
    inner: int
    cap: None = None
    inner_steps: int = 0

    def step(self, batch, n: int, plan: list[int]) -> tuple[torch.Tensor, int, float]:
        """This rank's `n` samples of the round whose shares are `plan`: inner steps of at
        most the inner batch (`split_batch`), each a compute phase of the emulator and an
        optimizer step on the rank's own mean loss; the optimizer takes the outer step after
        the last, with this rank's weight n / sum(plan) (`RoundOptimizer.begin_round`).
        Returns (the summed loss, its count, the bytes the counter charged)."""
        net, amp, emu = self.net, self.amp, self.emu
        parts = split_batch(batch, n, self.inner) if n > 0 else []
        net.opt.begin_round(len(parts), n / max(sum(plan), 1))
        total_loss, total = torch.zeros(()), 0
        for part in parts:
            emu.start(key=len(part[0]))
            with amp.autocast():
                loss_sum, count = self.recipe.loss(net.model, part)
            amp.scale(loss_sum / max(int(count), 1)).backward()
            emu.finish()
            amp.step(net.opt)
            net.opt.zero_grad(set_to_none=True)
            total_loss = total_loss + loss_sum.detach().float().cpu()
            total += int(count)
        self.inner_steps = len(parts)
        nbytes, _ = self.counter.take()
        return total_loss, total, nbytes

    def warm_up(self, batch) -> None:
        """`Stepper.warm_up`: one untimed pass without effect on the run."""
        Stepper.warm_up(self, batch)
