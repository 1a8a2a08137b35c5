"""What the simulator reasons about: the model trained, the workers, the network, the job.

Frozen dataclasses, each checked on construction: a figure the simulator cannot use raises a
`SimulationError` (a `ConfigError`) naming the field. No I/O and no torch: the local models'
figures are counted by hand (tests check them against `hetflow.training.recipes`).
"""

from __future__ import annotations

import dataclasses
import itertools
import math
from dataclasses import dataclass
from typing import Literal

from hetflow.config import ConfigError

MIB = 2**20
DDP_BUCKET_BYTES = 25 * MIB  # torch DDP's bucket_cap_mb default
DDP_FIRST_BUCKET_BYTES = 1 * MIB  # torch DDP's first bucket (dist._DEFAULT_FIRST_BUCKET_BYTES)
MAX_WORKERS = 1 << 16

# Intra-node all-reduce bus bandwidth per GPU family, Gbit/s: what nccl-tests' all_reduce_perf
# reports as "busbw" inside one 8-GPU server, rounded: V100 NVLink 2 (DGX-1 / p3.16xlarge,
# p3dn.24xlarge) ~130 GB/s; A100 NVSwitch (DGX A100 / p4d) ~230 GB/s; H100 NVSwitch (DGX H100 /
# p5) ~450 GB/s. GPUs without NVLink (g4dn, g5, g6 multi-GPU sizes) share PCIe: Gen3 x16
# ~12 GB/s (T4), Gen4 x16 ~24 GB/s (A10G, L4). These are approximate, order-of-magnitude
# figures that infra.catalog does not carry (EC2's describe_instance_types has no interconnect
# bandwidth); override with Network.intra_gbps.
INTRA_NODE_GBPS: dict[str, float] = {
    "V100": 1040.0,
    "A100": 1840.0,
    "H100": 3600.0,
    "H200": 3600.0,
    "T4": 96.0,
    "T4g": 96.0,
    "A10G": 192.0,
    "L4": 192.0,
    "L40S": 192.0,
    "CPU": 400.0,  # shared memory inside one host
}
DEFAULT_INTRA_GBPS = 96.0


class SimulationError(ConfigError):
    """Input the simulator cannot use: one line, naming the field."""


def check_workers(n) -> int:
    """n itself if it is a whole number of workers in [1, MAX_WORKERS]; SimulationError if not."""
    if isinstance(n, bool) or not isinstance(n, int) or n < 1:
        raise SimulationError(f"workers: must be a whole number >= 1 (got {n!r})")
    if n > MAX_WORKERS:
        raise SimulationError(f"workers: at most {MAX_WORKERS} (got {n})")
    return n


# -- models -----------------------------------------------------------------------------------


@dataclass(frozen=True)
class ModelSpec:
    """A model as the simulator sees it: its gradient, its FLOPs and its data.

    `per_sample_flops` is training FLOPs per sample (forward + backward ~ 3 x forward);
    `sample_bytes` what one sample weighs in storage; `epoch_samples` one pass over the data.
    """

    name: str
    params: int
    per_sample_flops: float
    sample_bytes: float
    epoch_samples: int
    default_local_batch: int | None = None
    default_global_batch: int | None = None
    source: str = ""

    @property
    def grad_bytes(self) -> float:
        return 4.0 * self.params  # fp32 gradients; compression is a Network knob


def _linear(i: int, o: int) -> tuple[int, int]:
    """(parameters, forward FLOPs per sample) of nn.Linear(i, o)."""
    return i * o + o, 2 * i * o


def _local_models() -> dict[str, ModelSpec]:
    # training.models on 8x8 digits, counted by hand (importing torch here would make the
    # simulator slow to import; tests check the counts against training.models).
    digits = {
        "sample_bytes": 64 * 4 + 8,
        "epoch_samples": 1437,
        "default_global_batch": 128,
        "source": "training.models on scikit-learn digits (1437 training samples)",
    }
    out = {}
    for name, widths in {"mlp": (64, 256, 256, 10), "wide_mlp": (64, 2048, 2048, 10)}.items():
        layers = [_linear(i, o) for i, o in itertools.pairwise(widths)]
        out[name] = ModelSpec(
            name, sum(p for p, _ in layers), 3.0 * sum(f for _, f in layers), **digits
        )
    conv1 = (1 * 32 * 9 + 32, 2 * 8 * 8 * 32 * 9)
    conv2 = (32 * 64 * 9 + 64, 2 * 8 * 8 * 64 * 32 * 9)
    fc1, fc2 = _linear(64 * 16, 128), _linear(128, 10)
    layers = [conv1, conv2, fc1, fc2]
    out["cnn"] = ModelSpec(
        "cnn", sum(p for p, _ in layers), 3.0 * sum(f for _, f in layers), **digits
    )
    # the recipes' names (TrainConfig.recipe, a profile's `model` since recipes); the short
    # names are those of profiles stored before
    for old, new in (("mlp", "digits-mlp"), ("cnn", "digits-cnn"), ("wide_mlp", "digits-wide-mlp")):
        out[new] = dataclasses.replace(out[old], name=new)
    return out


MODELS: dict[str, ModelSpec] = {
    # ResNet-50: 25.6M parameters, 4.1 GFLOP forward per 224x224 image (He et al. 2016 count
    # 3.8-4.1 G multiply-adds; 4.1 GFLOP is the figure the field quotes), training ~ 3 x forward.
    # ImageNet-1k: 1,281,167 training images, ~110 KB each as JPEG.
    "resnet50": ModelSpec(
        "resnet50",
        25_600_000,
        3 * 4.1e9,
        110e3,
        1_281_167,
        default_local_batch=64,
        source="He et al. 2016; ImageNet-1k train split",
    ),
    # BERT-Large: 340M parameters; forward ~ 2 FLOPs per parameter per token at sequence length
    # 128 -> 2 x 340e6 x 128 = 87 GFLOP, training ~ 3 x forward. An epoch: ~3.3B words of
    # BooksCorpus + English Wikipedia at ~1.3 tokens per word in 128-token sequences ~ 33.5M
    # sequences; a sample is 128 token ids + masks (~1.5 KB).
    "bert-large": ModelSpec(
        "bert-large",
        340_000_000,
        3 * 2 * 340e6 * 128,
        1.5e3,
        33_500_000,
        default_local_batch=32,
        source="Devlin et al. 2019",
    ),
    **_local_models(),
}


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

    def compute_s(self, batch: float) -> float:
        """a + c x batch."""
        return self.latency_s + self.per_sample_s * batch


@dataclass(frozen=True)
class Network:
    """How gradients travel: the collective, its alpha-beta figures, DDP's buckets, compression.

    alpha_s: per ring hop between nodes; intra_alpha_s: per hop inside a node. intra_gbps:
    intra-node bus bandwidth (None: by the GPU family, `INTRA_NODE_GBPS`). link_gbps: when set,
    every worker's network share (overrides the catalog or profile). average_every: the
    hierarchical collective crosses nodes every H steps only (hetflow's `hierarchical:H`).
    """

    collective: Literal["ring", "hierarchical"] = "ring"
    alpha_s: float = 25e-6
    intra_alpha_s: float = 5e-6
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
        if grad_bytes <= self.first_bucket_bytes:
            return 1
        return 1 + math.ceil((grad_bytes - self.first_bucket_bytes) / self.bucket_bytes)


@dataclass(frozen=True)
class Job:
    """What one step is: the model, the batch (global fixed, or local fixed = weak scaling)."""

    model: ModelSpec
    global_batch: int | None = None
    local_batch: int | None = None
    step_overhead_s: float = 0.0
    jitter: float = 0.0
    prefetch: bool = True

    def __post_init__(self) -> None:
        if (self.global_batch is None) == (self.local_batch is None):
            raise SimulationError(
                "job: give exactly one of global_batch (strong scaling) or local_batch (weak)"
            )
        for name in ("global_batch", "local_batch"):
            v = getattr(self, name)
            if v is not None and v < 1:
                raise SimulationError(f"job.{name}: must be >= 1 (got {v})")
        if not (math.isfinite(self.step_overhead_s) and self.step_overhead_s >= 0):
            raise SimulationError(
                f"job.step_overhead_s: must be >= 0 (got {self.step_overhead_s!r})"
            )
        if not (math.isfinite(self.jitter) and self.jitter >= 0):
            raise SimulationError(f"job.jitter: must be >= 0 (got {self.jitter!r})")

    def batch_for(self, n: int) -> int:
        """The global batch on n workers (local batch x n for weak scaling)."""
        return self.global_batch if self.global_batch is not None else self.local_batch * n
