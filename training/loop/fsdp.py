"""`strategy: fsdp`: the `Net` of a model sharded across the ranks (`ShardedNet`) and its
builder (`build_sharded_net`). How the model is sharded, checkpointed and gathered is torch's
FSDP2 and DCP, in `training.loop.sharded` (which says what differs from DDP)."""

from __future__ import annotations

from collections.abc import Callable
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass, field
from functools import partial

from torch import nn

from hetflow.infra.data.reader import RankData
from hetflow.training.hooks import PhaseClock
from hetflow.training.launch.spec import RunSpec
from hetflow.training.loop import sharded
from hetflow.training.loop.micro import micro_caps, splits
from hetflow.training.loop.net import Net, replica
from hetflow.training.loop.optim import build_optimizer
from hetflow.training.recipes import DataInfo, Recipe, seeded_model


@dataclass
class ShardedNet(Net):
    """A `Net` whose `model` is sharded in place (`sharded.shard_model`): `ddp` is `model`
    itself, `hook_state` None. `plain` builds an unsharded copy of the model for rank 0's
    evaluation; `caps` (`train.accumulate` 'auto') every rank's largest micro-batch
    (`micro_caps`), which tell each step whether any rank's share splits (`step_context`).
    Every rank writes its shards into a checkpoint; the full state is a collective."""

    plain: Callable[[], nn.Module] | None = None
    caps: list[int | None] | None = None
    _copy: nn.Module | None = field(default=None, init=False, repr=False)

    sharded = True
    warms_up = False  # a sharded model has no pass without collectives

    def step_context(self, plan: list[int]) -> AbstractContextManager:
        """Where any rank's share of `plan` splits into micro-batches, every rank's units stay
        gathered for the step (`sharded.gathered`; the plan is the same on every rank, so all
        enter it alike); otherwise nothing."""
        if self.caps and any(map(splits, plan, self.caps)):
            return sharded.gathered(self.model)
        return nullcontext()

    def no_sync(self) -> AbstractContextManager:
        return sharded.no_sync(self.model)

    def full_state(self) -> tuple[dict, dict]:
        """Gathered from every rank's shards onto rank 0: a collective every rank calls."""
        return sharded.full_state(self.model, self.opt)

    def weights(self) -> dict:
        return self.full_state()[0]

    def checkpoint_state(self, shards: str | None) -> tuple[dict, dict]:
        """Every rank writes its shards into the folder `shards` (`sharded.save_shards`, a
        collective); both dicts are empty."""
        sharded.save_shards(self.model, self.opt, shards)
        return {}, {}

    def load_state(self, model_state: dict, opt_state: dict, shards: str | None) -> None:
        """The checkpoint's DCP folder `shards`, re-sharded onto this run's ranks."""
        sharded.load_shards(self.model, self.opt, shards)

    def evaluation_model(self, rank: int) -> nn.Module | None:
        """An unsharded copy on rank 0, loaded with the weights gathered from every rank
        (every rank calls it); None elsewhere."""
        weights, _ = sharded.full_state(self.model, self.opt)
        if rank != 0:
            return None
        if self._copy is None:  # built once, on rank 0 only
            self._copy = self.plain().to(self.device)
        self._copy.load_state_dict(weights)
        return self._copy


def build_sharded_net(
    spec: RunSpec, data: RankData, emu: PhaseClock, recipe: Recipe, device: str, *, rank: int
) -> ShardedNet:
    """The recipe's model (`net.replica`) sharded over the recipe's `shard_units`, with no comm
    hook; the configured optimizer, at whose step the compute phase of `emu` ends
    (`sharded.end_phase_at_step`)."""
    cfg = spec.train
    model = replica(spec, data, recipe, device, rank)
    model = sharded.shard_model(model, recipe.shard_units(model))
    opt = build_optimizer(model, cfg)  # resolved before launch
    sharded.end_phase_at_step(opt, emu)
    info = DataInfo.from_manifest(data.manifest)
    plain = partial(seeded_model, recipe, info, cfg.seed)
    return ShardedNet(model, model, opt, None, device, plain=plain, caps=micro_caps(spec))
