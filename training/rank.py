"""This rank in this job: one value built by the worker (`worker.run`) and passed down to the
training loop, the profile's probes and the compression trials."""

from __future__ import annotations

from dataclasses import dataclass

from hetflow.config import TrainConfig
from hetflow.infra.data.reader import RankData
from hetflow.training.comm import WireCounter
from hetflow.training.devices import MixedPrecision
from hetflow.training.launch.spec import RunSpec


@dataclass
class RankContext:
    """The job's `spec`; this process's `rank` of `world`; the `data` it streams; its device
    and precision with the loss scale every rank shares (`amp`); the `counter` of the bytes
    it sends. The group of ranks that compute changes with the plan: the loop holds it
    (`loop.computing.ComputingRanks`)."""

    spec: RunSpec
    rank: int
    world: int
    data: RankData
    amp: MixedPrecision
    counter: WireCounter

    @property
    def device(self) -> str:
        return self.amp.device

    @property
    def train(self) -> TrainConfig:
        return self.spec.train
