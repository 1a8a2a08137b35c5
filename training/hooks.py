"""The hooks the worker installs on a rank (`training.worker.run`, into its `RankContext`), so
that the training loop and its step call an interface, not the emulator: the compute-phase
clock (`PhaseClock`, which `hetflow.emulation.emulator.Emulator` implements: it times each
compute phase and, on an emulated device, dilates it) and the wire counter
(`training.comm.accounting.WireCounter`, installed around `torch.distributed`'s collectives,
the emulated link attached to it). In the cloud the same clock runs at slowdown 1 with no link
delay: it only times."""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol


class PhaseClock(Protocol):
    """What a step calls at the edges of its compute phase (forward and backward, up to the
    comm hook's last bucket or the optimizer's step)."""

    def start(self, key: object = None) -> None:
        """A compute phase begins; `key` (the batch's size) names what it computes."""

    def finish(self) -> float:
        """The phase ends (a second call before the next `start` is a no-op); when it ended."""
        ...

    def at_step(self, step: int) -> None:
        """The run is at `step` (an emulated straggler's factor follows it)."""

    def forget(self) -> None:
        """Drop what earlier phases measured (a compression trial's timed steps)."""

    def dilating_hook(self, hook: Callable) -> Callable:
        """DDP's comm hook `hook`, wrapped to end the phase at its last bucket."""
        ...
