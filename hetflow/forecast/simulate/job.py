"""What the simulator reasons about: the model trained, the workers, the network, the job.

Frozen dataclasses, each checked on construction: a figure the simulator cannot use raises a
`SimulationError` (a `ConfigError`) naming the field. No I/O and no torch. The models' figures
(`ModelSpec`, `MODELS`) live in `hetflow.forecast.simulate.models`, the ring's (`INTRA_NODE_GBPS`,
DDP's buckets) in the performance model, `hetflow.perf.collective`; both are re-exported here.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal

from hetflow.config import ConfigError
from hetflow.forecast.simulate.models import MODELS, ModelSpec  # noqa: F401 (re-exported)
from hetflow.perf.collective import (  # noqa: F401 (re-exported)
    DDP_BUCKET_BYTES,
    DDP_FIRST_BUCKET_BYTES,
    DEFAULT_INTRA_GBPS,
    INTRA_NODE_GBPS,
    MIB,
    RING_ALPHA_S,
    RING_INTRA_ALPHA_S,
    ddp_buckets,
)
from hetflow.perf.curve import Line

MAX_WORKERS = 1 << 16


class SimulationError(ConfigError):
    """Input the simulator cannot use: one line, naming the field."""


def check_workers(n) -> int:
    """n itself if it is a whole number of workers in [1, MAX_WORKERS]; SimulationError if not."""
    if isinstance(n, bool) or not isinstance(n, int) or n < 1:
        raise SimulationError(f"workers: must be a whole number >= 1 (got {n!r})")
    if n > MAX_WORKERS:
        raise SimulationError(f"workers: at most {MAX_WORKERS} (got {n})")
    return n


# -- workers, network, job --------------------------------------------------------------------


@dataclass(frozen=True)
class WorkerModel:
    """One worker (one device) as the simulator sees it.

    latency_s, per_sample_s: its compute step a + c x batch. link_gbps: its share of the node's
    network (the node's NIC = the sum over the node's workers). storage_mbps: its read
    throughput from the dataset's storage (None: the data is local). cap: the largest local
    batch its memory holds. usd_per_hour: its share of its instance's price.
    """

    name: str
    latency_s: float
    per_sample_s: float
    link_gbps: float | None = None
    node: str = ""
    storage_mbps: float | None = None
    cap: int | None = None
    usd_per_hour: float = 0.0
    kind: str = ""  # instance type or profile label, for tables
    device: str = "CPU"

    def __post_init__(self) -> None:
        where = f"worker {self.name}"
        for name in ("latency_s", "per_sample_s", "usd_per_hour"):
            v = getattr(self, name)
            if not (isinstance(v, (int, float)) and math.isfinite(v) and v >= 0):
                raise SimulationError(f"{where}: {name} must be a finite number >= 0 (got {v!r})")
        if not self.per_sample_s > 0:
            raise SimulationError(f"{where}: per_sample_s must be > 0 (got {self.per_sample_s!r})")
        for name in ("link_gbps", "storage_mbps"):
            v = getattr(self, name)
            if v is not None and not (math.isfinite(v) and v > 0):
                raise SimulationError(f"{where}: {name} must be a finite number > 0 (got {v!r})")
        if self.cap is not None and self.cap < 1:
            raise SimulationError(f"{where}: cap must be >= 1 (got {self.cap})")

    @property
    def line(self) -> Line:
        """Its compute step as the performance model's line, a + c x batch."""
        return Line(self.latency_s, self.per_sample_s)

    def compute_s(self, batch: float) -> float:
        """a + c x batch."""
        return self.line.time(batch)


@dataclass(frozen=True)
class Network:
    """How gradients travel: the collective, its alpha-beta figures, DDP's buckets, compression.

    alpha_s: per ring hop between nodes; intra_alpha_s: per hop inside a node. intra_gbps:
    intra-node bus bandwidth (None: by the GPU family, `INTRA_NODE_GBPS`). link_gbps: when set,
    every worker's network share (overrides the catalog or profile). average_every: the
    hierarchical collective crosses nodes every H steps only (hetflow's `hierarchical:H`).
    """

    collective: Literal["ring", "hierarchical"] = "ring"
    alpha_s: float = RING_ALPHA_S
    intra_alpha_s: float = RING_INTRA_ALPHA_S
    intra_gbps: float | None = None
    link_gbps: float | None = None
    bucket_bytes: float = DDP_BUCKET_BYTES
    first_bucket_bytes: float = DDP_FIRST_BUCKET_BYTES
    compression_ratio: float = 1.0
    overlap: float = 0.0
    average_every: int = 1

    def __post_init__(self) -> None:
        if self.collective not in ("ring", "hierarchical"):
            raise SimulationError(f"collective: {self.collective!r} is not ring or hierarchical")
        for name in ("alpha_s", "intra_alpha_s"):
            v = getattr(self, name)
            if not (math.isfinite(v) and v >= 0):
                raise SimulationError(f"network.{name}: must be a finite number >= 0 (got {v!r})")
        for name in ("intra_gbps", "link_gbps"):
            v = getattr(self, name)
            if v is not None and not (math.isfinite(v) and v > 0):
                raise SimulationError(f"network.{name}: must be a finite number > 0 (got {v!r})")
        if not (math.isfinite(self.bucket_bytes) and self.bucket_bytes > 0):
            raise SimulationError(f"network.bucket_bytes: must be > 0 (got {self.bucket_bytes!r})")
        ratio = self.compression_ratio
        if not (math.isfinite(ratio) and ratio >= 1):
            raise SimulationError(f"network.compression_ratio: must be >= 1 (got {ratio!r})")
        if not 0 <= self.overlap <= 1:
            raise SimulationError(f"network.overlap: must be in [0, 1] (got {self.overlap!r})")
        if self.average_every < 1:
            raise SimulationError(f"network.average_every: must be >= 1 (got {self.average_every})")

    def buckets(self, grad_bytes: float) -> int:
        """All-reduces per step: DDP's small first bucket, then buckets of bucket_bytes."""
        return ddp_buckets(grad_bytes, self.first_bucket_bytes, self.bucket_bytes)


@dataclass(frozen=True)
class Job:
    """What is trained and how: the model, the batch (global fixed, or local fixed = weak
    scaling), how many steps (for a run's time and cost; None: per step and per epoch only),
    the step's fixed overhead and the stragglers' jitter, and whether data is prefetched.
    The simulator and the rental search read this one job."""

    model: ModelSpec
    global_batch: int | None = None
    local_batch: int | None = None
    steps: int | None = None
    step_overhead_s: float = 0.0
    jitter: float = 0.0
    prefetch: bool = True

    def __post_init__(self) -> None:
        if (self.global_batch is None) == (self.local_batch is None):
            raise SimulationError(
                "job: give exactly one of global_batch (strong scaling) or local_batch (weak)"
            )
        for name in ("global_batch", "local_batch", "steps"):
            v = getattr(self, name)
            if v is not None and (isinstance(v, bool) or not isinstance(v, int) or v < 1):
                raise SimulationError(f"job.{name}: must be a whole number >= 1 (got {v!r})")
        if not (math.isfinite(self.step_overhead_s) and self.step_overhead_s >= 0):
            raise SimulationError(
                f"job.step_overhead_s: must be >= 0 (got {self.step_overhead_s!r})"
            )
        if not (math.isfinite(self.jitter) and self.jitter >= 0):
            raise SimulationError(f"job.jitter: must be >= 0 (got {self.jitter!r})")

    def batch_for(self, n: int) -> int:
        """The global batch on n workers (local batch x n for weak scaling)."""
        return self.global_batch if self.global_batch is not None else self.local_batch * n
