"""This rank in this job: one value built by the worker (`worker.run`) and passed down to the
training loop, the profile's probes and the compression trials."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from hetflow.config import TrainConfig
from hetflow.infra.data.reader import RankData
from hetflow.training.comm import WireCounter
from hetflow.training.devices import MixedPrecision
from hetflow.training.hooks import PhaseClock
from hetflow.training.launch.spec import RunSpec
from hetflow.training.launch.startup import StartupMarks
from hetflow.training.recipes import Recipe


@dataclass
class RankContext:
    """The job's `spec`; this process's `rank` of `world`; the `data` it streams; its device
    and precision with the loss scale every rank shares (`amp`); the hooks the worker installs
    (`training.hooks`): the `counter` of the bytes it sends, the training's compute-phase
    clock `emu` (the emulator; its link attached to the counter) and `clocks`, which makes a
    fresh one for a scope of its own (a compression trial's); `startup`: the marks of its
    start-up's phases (`launch.startup`), where its launcher makes them; `recipe`: the job's
    recipe (`recipes.recipe_of` of `spec.train`), made once by the worker. The group of ranks
    that compute changes with the plan: the loop holds it (`loop.computing.ComputingRanks`)."""

    spec: RunSpec
    rank: int
    world: int
    data: RankData
    amp: MixedPrecision
    counter: WireCounter
    emu: PhaseClock | None = None
    clocks: Callable[[str], PhaseClock] | None = None
    startup: StartupMarks | None = None
    recipe: Recipe | None = None

    @property
    def device(self) -> str:
        return self.amp.device

    @property
    def train(self) -> TrainConfig:
        return self.spec.train
