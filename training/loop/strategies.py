"""How a rank trains (`train.strategy`), as plug-ins behind one small interface, in a registry,
as torchtitan's train specs (`torchtitan/protocols/train_spec.py`): a `Strategy` names the
builders of its parts, and the loop asks the registry for them (`strategy_of`), so that a new
way to train is a new entry (`register_strategy`), not a new `if` in the loop.

The interface: `build_net` makes the model and optimizer for a rank, as a `Net` that also
answers for the state a checkpoint keeps and the model rank 0 evaluates (`Net.checkpoint_state`,
`load_state`, `full_state`, `evaluation_model`); `build_stepper` makes what runs one loop step
on it (`Stepper.step`: a step, or a round of inner steps under `diloco`).

The built-ins: `ddp` (`net.build_net`: DDP with the plan's comm hook), `fsdp`
(`fsdp.build_sharded_net`: FSDP2, sharded checkpoints) and `diloco` (`rounds.build_round_net`:
no DDP; each loop step a round of inner steps, then the outer step).

    >>> sorted(STRATEGIES)
    ['ddp', 'diloco', 'fsdp']
    >>> strategy_of("zero3")
    Traceback (most recent call last):
    ...
    ValueError: train.strategy: 'zero3' is not a registered strategy (ddp, diloco, fsdp)
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from hetflow.training.hooks import PhaseClock
from hetflow.training.launch.spec import RunSpec
from hetflow.training.loop.diloco import RoundStepper, build_round_net, round_inner_batch
from hetflow.training.loop.fsdp import build_sharded_net
from hetflow.training.loop.micro import micro_cap
from hetflow.training.loop.net import Net, build_net
from hetflow.training.loop.rank_step import Stepper
from hetflow.training.loop.weighting import MeanOverCounts
from hetflow.training.recipes import Recipe

# (spec, data, emu, recipe, device, *, rank) -> the rank's Net
NetBuilder = Callable[..., Net]


@dataclass(frozen=True)
class StepParts:
    """What a step is built from besides the `Net`, fixed for a run: the rank and its job, the
    compute-phase clock (`PhaseClock`, the worker's emulator), the loss's mean over counts, the
    precision (`MixedPrecision`), the wire counter and the recipe."""

    spec: RunSpec
    rank: int
    emu: PhaseClock
    mean: MeanOverCounts
    amp: object
    counter: object
    recipe: Recipe


@dataclass(frozen=True)
class Strategy:
    """One way to train: its `name` (`train.strategy`), the builder of a rank's model and
    optimizer (`build_net`) and that of its loop step (`build_stepper`: from the `Net` and the
    `StepParts`, an object with `step(batch, n, plan)`, `warm_up(batch)` and `cap`)."""

    name: str
    build_net: NetBuilder
    build_stepper: Callable[[Net, StepParts], object]


STRATEGIES: dict[str, Strategy] = {}


def register_strategy(strategy: Strategy) -> Strategy:
    """Add `strategy` to the registry under its name (a second of one name is refused)."""
    if strategy.name in STRATEGIES:
        raise ValueError(f"train.strategy: {strategy.name!r} is already registered")
    STRATEGIES[strategy.name] = strategy
    return strategy


def strategy_of(name: str) -> Strategy:
    """The registered strategy `name`; a one-line ValueError naming `train.strategy` if none."""
    try:
        return STRATEGIES[name]
    except KeyError:
        known = ", ".join(sorted(STRATEGIES))
        raise ValueError(
            f"train.strategy: {name!r} is not a registered strategy ({known})"
        ) from None


def replica_stepper(net: Net, p: StepParts) -> Stepper:
    """`ddp`'s and `fsdp`'s step: one pass, or micro-batches past the rank's cap."""
    cap = micro_cap(p.spec, p.rank)
    return Stepper(net, p.emu, p.mean, p.amp, p.counter, p.recipe, cap)


def round_stepper(net: Net, p: StepParts) -> RoundStepper:
    """`diloco`'s step: a round of inner steps of the inner batch, then the outer step."""
    inner = round_inner_batch(p.spec)
    return RoundStepper(net, p.emu, p.amp, p.counter, p.recipe, inner)


register_strategy(Strategy("ddp", build_net, replica_stepper))
register_strategy(Strategy("fsdp", build_sharded_net, replica_stepper))
register_strategy(Strategy("diloco", build_round_net, round_stepper))
