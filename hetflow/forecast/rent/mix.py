"""What the rental search (`rent.search`) reasons over, and what 'best' (`rent.objective`)
ranks: a candidate instance type with its step-time curve, and one mix as the model predicts it
(pure). Both rooms import these; neither imports the other for them."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from hetflow.forecast.simulate.memory import MemoryLimit
from hetflow.perf.collective import DEFAULT_INTRA_GBPS, INTRA_NODE_GBPS
from hetflow.perf.curve import Table


@dataclass(frozen=True)
class Candidate:
    """One instance type that may be rented: up to `available` instances, each of `devices`
    GPUs (workers) whose step at local batch b is `step_s[b - 1]` (non-decreasing)."""

    instance_type: str
    available: int
    usd_per_hour: float  # one instance
    devices: int
    gpu: str
    preset: str | None  # the GPU's emulation preset; None: none (its curve was measured)
    nic_gbps: float  # one instance's network, all its GPUs together
    step_s: tuple[float, ...] = field(repr=False)
    spot_usd_per_hour: float | None = None  # one instance on spot; None: not on spot
    interruptions_per_hour: float = 0.0  # one spot instance's
    measured: str | None = None  # where its curve was measured; None: published
    memory: MemoryLimit | None = field(default=None, repr=False)  # its largest local batch

    @property
    def intra_gbps(self) -> float:
        return INTRA_NODE_GBPS.get(self.gpu, DEFAULT_INTRA_GBPS)

    @property
    def curve(self) -> Table:
        """One device's step-time curve, the performance model's `Table`."""
        return Table(self.step_s)

    def batch_within(self, t: float) -> int:
        """The most samples one device computes within t seconds (0: not even one)."""
        return self.curve.within(t)


@dataclass(frozen=True)
class Prediction:
    """One mix (instances per candidate, in the candidates' order) in one market as the model
    predicts it; on spot, `hours` and `cost_usd` are expected with `interruptions`."""

    counts: tuple[int, ...]
    step_s: float
    compute_s: float
    comm_s: float
    hours: float
    cost_usd: float
    usd_per_hour: float
    market: str = "on-demand"
    interruptions: float = 0.0  # expected over the run
    bare_hours: float = 0.0  # without interruptions

    def label(self, cands: Sequence[Candidate], market: bool = True) -> str:
        mix = " + ".join(
            f"{c.instance_type} x{n}" for c, n in zip(cands, self.counts, strict=True) if n
        )
        return mix + (" (spot)" if market and self.market == "spot" else "")

    def types(self) -> int:
        return sum(1 for n in self.counts if n)
