"""The scale simulator: synchronous data-parallel training at 1 to 1024 workers (pure, no I/O).

One optimizer step of synchronous data parallelism, worker by worker::

    compute_i  = a_i + c_i x b_i                                          (profile's fit)
    data_i     = max(0, b_i x sample_bytes / storage_i - prefetch x compute_i)
    step       = max_i (data_i + compute_i) x (1 + jitter x z_n) + overhead + exposed_comm
    throughput = global_batch / step

- **Compute.** a_i (`fit_latency_s`) and c_i (`fit_s_per_sample`) come from a hetflow profile,
  rank by rank; for an instance type never measured, c_i = per-sample FLOPs / (device peak
  FLOP/s x achieved fraction) and a_i = 0, with the peak from `infra.catalog`
  (`DEVICE_PEAK_TFLOPS`: FP32 datasheet figures) and the achieved fraction an input. The
  profile times a step through DDP (`training.probes.solo_ddp`), so DDP's own work in backward
  is in a_i and c_i already.
- **Communication**, from the alpha-beta model of the collective DDP runs (buckets of
  `bucket_bytes`, each one all-reduce; gradient bytes divided by `compression_ratio`):
  ring: buckets x 2(n-1) x alpha + 2(n-1)/n x bytes x beta, where beta is the slowest edge of a
  ring laid out node by node (inside a node the intra-node link, between nodes the node's NIC:
  one ring edge leaves each node); hierarchical: reduce-scatter and all-gather inside each node
  (2(g-1) x alpha_intra + 2(g-1)/g x bytes x beta_intra) around a ring across the N nodes
  (2(N-1) x alpha + 2(N-1)/N x bytes x beta_NIC), the slowest node setting the pace.
  `overlap` is the fraction of the slowest compute that communication can hide behind
  (DDP overlaps bucket all-reduces with backward); 0 is what hetflow's emulated links do.
- **Data wait**, from a storage model: each worker reads its b_i samples at its storage
  throughput; with prefetch the read overlaps that step's compute. No storage figure: the data
  is local (cached), no wait.
- **Straggler jitter** (optional): with per-step compute times varying by a coefficient of
  variation `jitter`, a synchronous step waits for the slowest of n, z_n = the expected maximum
  of n standard normals (Blom's approximation).
- **Overhead**: a fixed cost per step outside compute and communication (optimizer step, DDP
  bookkeeping, Python), which a profile does not measure; calibration estimates it.

Plans: `baseline` is the equal split (`training.scheduler.equal_batches`), `optimized` is
hetflow's plan (`training.scheduler.balance_batches` on the same a_i, c_i and memory caps).

Scaling efficiency = throughput / the sum over workers of what each would do alone at the
same local batch (global_batch / n), communication-free. One worker: 1.0. For weak scaling
(fixed local batch) that is the usual T(n) / (n x T(1)); on a mixed cluster it also charges
the idle time an unbalanced split leaves.

Time per epoch = epoch samples / throughput; cost per epoch = time x the cluster's hourly price
(a `--mix` pays whole instances: a worker costs its instance's price over the workers placed on
it; a worker of a cluster file costs its device's share of its instance).
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from statistics import NormalDist
from typing import Literal

from hetflow.config import ConfigError
from hetflow.infra.catalog import DEVICE_PEAK_TFLOPS, Catalog
from hetflow.training.scheduler import balance_batches, equal_batches, fitted_step_model

MIB = 2**20
DDP_BUCKET_BYTES = 25 * MIB  # torch DDP's bucket_cap_mb default
DDP_FIRST_BUCKET_BYTES = 1 * MIB  # torch DDP's first bucket (dist._DEFAULT_FIRST_BUCKET_BYTES)
MAX_WORKERS = 1 << 16
PLANS = ("baseline", "optimized")

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
    digits = {"sample_bytes": 64 * 4 + 8, "epoch_samples": 1437, "default_global_batch": 128,
              "source": "training.models on scikit-learn digits (1437 training samples)"}
    out = {}
    for name, widths in {"mlp": (64, 256, 256, 10), "wide_mlp": (64, 2048, 2048, 10)}.items():
        layers = [_linear(i, o) for i, o in itertools.pairwise(widths)]
        out[name] = ModelSpec(name, sum(p for p, _ in layers), 3.0 * sum(f for _, f in layers), **digits)
    conv1 = (1 * 32 * 9 + 32, 2 * 8 * 8 * 32 * 9)
    conv2 = (32 * 64 * 9 + 64, 2 * 8 * 8 * 64 * 32 * 9)
    fc1, fc2 = _linear(64 * 16, 128), _linear(128, 10)
    layers = [conv1, conv2, fc1, fc2]
    out["cnn"] = ModelSpec("cnn", sum(p for p, _ in layers), 3.0 * sum(f for _, f in layers), **digits)
    return out


MODELS: dict[str, ModelSpec] = {
    # ResNet-50: 25.6M parameters, 4.1 GFLOP forward per 224x224 image (He et al. 2016 count
    # 3.8-4.1 G multiply-adds; 4.1 GFLOP is the figure the field quotes), training ~ 3 x forward.
    # ImageNet-1k: 1,281,167 training images, ~110 KB each as JPEG.
    "resnet50": ModelSpec("resnet50", 25_600_000, 3 * 4.1e9, 110e3, 1_281_167, default_local_batch=64,
                          source="He et al. 2016; ImageNet-1k train split"),
    # BERT-Large: 340M parameters; forward ~ 2 FLOPs per parameter per token at sequence length
    # 128 -> 2 x 340e6 x 128 = 87 GFLOP, training ~ 3 x forward. An epoch: ~3.3B words of
    # BooksCorpus + English Wikipedia at ~1.3 tokens per word in 128-token sequences ~ 33.5M
    # sequences; a sample is 128 token ids + masks (~1.5 KB).
    "bert-large": ModelSpec("bert-large", 340_000_000, 3 * 2 * 340e6 * 128, 1.5e3, 33_500_000,
                            default_local_batch=32, source="Devlin et al. 2019"),
    **_local_models(),
}


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
        for name in ("latency_s", "per_sample_s", "usd_per_hour"):
            v = getattr(self, name)
            if not (isinstance(v, (int, float)) and math.isfinite(v) and v >= 0):
                raise SimulationError(f"worker {self.name}: {name} must be a finite number >= 0 (got {v!r})")
        if not self.per_sample_s > 0:
            raise SimulationError(f"worker {self.name}: per_sample_s must be > 0 (got {self.per_sample_s!r})")
        for name in ("link_gbps", "storage_mbps"):
            v = getattr(self, name)
            if v is not None and not (math.isfinite(v) and v > 0):
                raise SimulationError(f"worker {self.name}: {name} must be a finite number > 0 (got {v!r})")
        if self.cap is not None and self.cap < 1:
            raise SimulationError(f"worker {self.name}: cap must be >= 1 (got {self.cap})")

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
        if not (math.isfinite(self.compression_ratio) and self.compression_ratio >= 1):
            raise SimulationError(f"network.compression_ratio: must be >= 1 (got {self.compression_ratio!r})")
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
            raise SimulationError("job: give exactly one of global_batch (strong scaling) or local_batch (weak)")
        for name in ("global_batch", "local_batch"):
            v = getattr(self, name)
            if v is not None and v < 1:
                raise SimulationError(f"job.{name}: must be >= 1 (got {v})")
        if not (math.isfinite(self.step_overhead_s) and self.step_overhead_s >= 0):
            raise SimulationError(f"job.step_overhead_s: must be >= 0 (got {self.step_overhead_s!r})")
        if not (math.isfinite(self.jitter) and self.jitter >= 0):
            raise SimulationError(f"job.jitter: must be >= 0 (got {self.jitter!r})")

    def batch_for(self, n: int) -> int:
        return self.global_batch if self.global_batch is not None else self.local_batch * n


@dataclass(frozen=True)
class StepPrediction:
    workers: int
    plan: str
    local_batches: list[int] = field(repr=False)
    global_batch: int
    step_time_s: float
    compute_s: float  # slowest worker's compute (with its data wait)
    comm_s: float  # the collective's time (before overlap)
    exposed_comm_s: float
    data_wait_s: float  # slowest worker's data wait
    idle_fraction: float  # mean share of the step a worker waits for the slowest
    throughput_samples_per_s: float
    ideal_samples_per_s: float
    efficiency: float
    epoch_time_s: float
    usd_per_hour: float
    cost_per_epoch: float

    def row(self) -> dict:
        return {
            "workers": self.workers, "plan": self.plan,
            "throughput_samples_per_s": self.throughput_samples_per_s, "efficiency": self.efficiency,
            "epoch_time_s": self.epoch_time_s, "cost_per_epoch": self.cost_per_epoch,
            "global_batch": self.global_batch, "step_time_s": self.step_time_s,
            "compute_s": self.compute_s, "comm_s": self.comm_s, "exposed_comm_s": self.exposed_comm_s,
            "data_wait_s": self.data_wait_s, "idle_fraction": self.idle_fraction,
            "usd_per_hour": self.usd_per_hour,
        }


# -- communication ----------------------------------------------------------------------------


def ring_allreduce_time(nbytes: float, n: int, alpha_s: float, gbps: float, collectives: int = 1) -> float:
    """Ring all-reduce of `nbytes` over n ranks: collectives x 2(n-1) x alpha + 2(n-1)/n x bytes x beta.

    beta = 1 / bandwidth (bytes/s). Same wire bytes as `training.comm.ring_allreduce_bytes`.
    """
    if n < 1:
        raise SimulationError(f"workers: must be >= 1 (got {n})")
    if n == 1:
        return 0.0
    return collectives * 2 * (n - 1) * alpha_s + 2 * (n - 1) / n * nbytes * 8 / (gbps * 1e9)


def _nodes(workers: Sequence[WorkerModel]) -> dict[str, list[WorkerModel]]:
    nodes: dict[str, list[WorkerModel]] = {}
    for w in workers:
        nodes.setdefault(w.node or w.name, []).append(w)
    return nodes


def _intra_gbps(group: Sequence[WorkerModel], network: Network) -> float:
    if network.intra_gbps is not None:
        return network.intra_gbps
    return min(INTRA_NODE_GBPS.get(w.device, DEFAULT_INTRA_GBPS) for w in group)


def _nic_gbps(group: Sequence[WorkerModel], network: Network) -> float:
    shares = [network.link_gbps or w.link_gbps for w in group]
    if any(s is None for s in shares):
        return math.inf  # an unlimited link (loopback)
    return sum(shares)


def allreduce_time(workers: Sequence[WorkerModel], grad_bytes: float, network: Network) -> float:
    """Seconds one step's gradient all-reduce takes on these workers (all its buckets)."""
    n = len(workers)
    if n <= 1:
        return 0.0
    nbytes = grad_bytes / network.compression_ratio
    k = network.buckets(nbytes)
    nodes = _nodes(workers)
    groups = list(nodes.values())
    n_nodes = len(groups)
    g = max(len(grp) for grp in groups)
    if network.collective == "ring" or n_nodes == 1 or g == 1:
        # one ring over all ranks, node by node; its slowest edge sets the pace
        edges = []
        if n_nodes > 1:
            edges += [_nic_gbps(grp, network) for grp in groups]
        if g > 1:
            edges += [_intra_gbps(grp, network) for grp in groups if len(grp) > 1]
        bw = min(edges)
        alpha = network.alpha_s if n_nodes > 1 else network.intra_alpha_s
        t = ring_allreduce_time(nbytes, n, alpha, bw, k)  # an infinite bandwidth leaves alpha
        if network.collective == "hierarchical" and n_nodes > 1:
            t /= network.average_every
        return t
    # hierarchical: reduce-scatter in each node, ring across nodes, all-gather in each node
    intra = max(ring_allreduce_time(nbytes, len(grp), network.intra_alpha_s, _intra_gbps(grp, network), k)
                for grp in groups)
    nic = min(_nic_gbps(grp, network) for grp in groups)
    inter = ring_allreduce_time(nbytes, n_nodes, network.alpha_s, nic, k)
    return intra + inter / network.average_every


# -- one step ---------------------------------------------------------------------------------


_NORMAL = NormalDist()


def expected_max_normal(n: int) -> float:
    """E[max of n standard normals] (Blom's approximation; 0 for n = 1)."""
    if n <= 1:
        return 0.0
    return _NORMAL.inv_cdf((n - 0.375) / (n + 0.25))


def plan_batches_for(workers: Sequence[WorkerModel], global_batch: int, plan: str) -> list[int]:
    """The local batches of a plan: `baseline` equal split, `optimized` hetflow's balance."""
    n = len(workers)
    if plan == "baseline":
        return equal_batches(n, global_batch)
    if plan == "optimized":
        return balance_batches([w.per_sample_s for w in workers], [w.latency_s for w in workers],
                               global_batch, [w.cap for w in workers])
    raise SimulationError(f"plan: {plan!r} is not one of {', '.join(PLANS)}")


def _data_wait(w: WorkerModel, batch: float, model: ModelSpec, prefetch: bool) -> float:
    if w.storage_mbps is None or batch <= 0:
        return 0.0
    read = batch * model.sample_bytes * 8 / (w.storage_mbps * 1e6)
    return max(0.0, read - w.compute_s(batch)) if prefetch else read


def simulate_step(workers: Sequence[WorkerModel], job: Job, network: Network, plan: str = "baseline",
                  batches: Sequence[int] | None = None) -> StepPrediction:
    """Predict one synchronous step (and its epoch and cost) for a plan on these workers."""
    n = len(workers)
    if n < 1:
        raise SimulationError("workers: must be >= 1 (got 0)")
    gb = job.batch_for(n)
    if gb < n:
        raise SimulationError(f"global_batch: {gb} is smaller than the {n} workers")
    b = list(batches) if batches is not None else plan_batches_for(workers, gb, plan)
    model = job.model
    busy = []
    waits = []
    for w, bi in zip(workers, b, strict=True):
        d = _data_wait(w, bi, model, job.prefetch)
        waits.append(d)
        busy.append(d + w.compute_s(bi))
    slowest = max(busy)
    slowest_jittered = slowest * (1 + job.jitter * expected_max_normal(n))
    comm = allreduce_time(workers, model.grad_bytes, network)
    compute_only = max(w.compute_s(bi) for w, bi in zip(workers, b, strict=True))
    exposed = max(0.0, comm - network.overlap * compute_only)
    step = slowest_jittered + job.step_overhead_s + exposed
    throughput = gb / step
    ref = gb / n
    ideal = 0.0
    for w in workers:
        alone = _data_wait(w, ref, model, job.prefetch) + w.compute_s(ref) + job.step_overhead_s
        ideal += ref / alone
    idle = sum(slowest_jittered - t for t in busy) / (n * step)
    usd = sum(w.usd_per_hour for w in workers)
    epoch = model.epoch_samples / throughput
    return StepPrediction(
        workers=n, plan=plan, local_batches=b, global_batch=gb, step_time_s=step,
        compute_s=slowest, comm_s=comm, exposed_comm_s=exposed, data_wait_s=max(waits),
        idle_fraction=idle, throughput_samples_per_s=throughput, ideal_samples_per_s=ideal,
        efficiency=throughput / ideal, epoch_time_s=epoch, usd_per_hour=usd,
        cost_per_epoch=usd * epoch / 3600,
    )


def sweep(cluster_at, counts: Sequence[int], job: Job, network: Network,
          plans: Sequence[str] = PLANS) -> list[StepPrediction]:
    """simulate_step for each worker count (cluster_at(n) -> workers) and plan."""
    out = []
    for n in counts:
        check_workers(n)
        workers = cluster_at(n)
        for plan in plans:
            out.append(simulate_step(workers, job, network, plan))
    return out


def check_workers(n) -> int:
    if isinstance(n, bool) or not isinstance(n, int) or n < 1:
        raise SimulationError(f"workers: must be a whole number >= 1 (got {n!r})")
    if n > MAX_WORKERS:
        raise SimulationError(f"workers: at most {MAX_WORKERS} (got {n})")
    return n


# -- clusters ---------------------------------------------------------------------------------


def flops_worker(name: str, model: ModelSpec, peak_tflops: float, fraction: float, **kw) -> WorkerModel:
    """A worker whose compute comes from device figures: c = FLOPs / (peak x achieved fraction)."""
    if not (math.isfinite(fraction) and 0 < fraction <= 1):
        raise SimulationError(f"achieved fraction: must be in (0, 1] (got {fraction!r})")
    if not (math.isfinite(peak_tflops) and peak_tflops > 0):
        raise SimulationError(f"worker {name}: peak TFLOP/s must be > 0 (got {peak_tflops!r})")
    return WorkerModel(name=name, latency_s=0.0, per_sample_s=model.per_sample_flops / (peak_tflops * 1e12 * fraction),
                       **kw)


def _fraction_for(fraction: float | Mapping[str, float], device: str) -> float:
    if isinstance(fraction, Mapping):
        if device in fraction:
            return fraction[device]
        if "*" in fraction:
            return fraction["*"]
        raise SimulationError(f"achieved fraction: none given for device {device} (give DEVICE=F or *=F)")
    return fraction


def parse_mix(text: str) -> list[tuple[str, int]]:
    """`"g4dn.xlarge:32,g5.xlarge:16"` -> [("g4dn.xlarge", 32), ("g5.xlarge", 16)] (instances)."""
    out: list[tuple[str, int]] = []
    for part in (p.strip() for p in text.split(",")):
        if not part:
            continue
        name, sep, count = part.rpartition(":")
        try:
            k = int(count)
        except ValueError:
            k = -1
        if not sep or not name or k < 1:
            raise SimulationError(f"--mix: expected TYPE:COUNT with COUNT >= 1, e.g. g5.xlarge:16 (got {part!r})")
        out.append((name, k))
    if not out:
        raise SimulationError("--mix: at least one TYPE:COUNT is needed")
    names = [n for n, _ in out]
    if len(set(names)) != len(names):
        raise SimulationError(f"--mix: an instance type appears twice ({text!r})")
    return out


def scale_counts(counts: Sequence[int], n: int) -> list[int]:
    """n workers shared among kinds in proportion to `counts` (largest remainder, pure)."""
    total = sum(counts)
    exact = [c * n / total for c in counts]
    out = [math.floor(x) for x in exact]
    order = sorted(range(len(counts)), key=lambda i: (exact[i] - out[i], counts[i]), reverse=True)
    for i in order[: n - sum(out)]:
        out[i] += 1
    return out


def catalog_cluster(mix: Sequence[tuple[str, int]], catalog: Catalog, model: ModelSpec,
                    fraction: float | Mapping[str, float], n: int | None = None,
                    storage_mbps: float | None = None) -> list[WorkerModel]:
    """Workers of EC2 instance types (`mix`: type and instance count), compute from FLOPs.

    With n: n workers in the mix's proportions (by workers), packed into whole instances; an
    instance only partly used is paid in full (its price spread over the workers on it).
    """
    infos = [catalog.info(name) for name, _ in mix]  # a CatalogError names an unknown type
    per_kind = [k * info.devices for (_, k), info in zip(mix, infos, strict=True)]
    if n is not None:
        check_workers(n)
        per_kind = scale_counts(per_kind, n)
    workers: list[WorkerModel] = []
    for (name, _), info, count in zip(mix, infos, per_kind, strict=True):
        if count == 0:
            continue
        price, peak = catalog.price(name), info.peak_tflops
        f = _fraction_for(fraction, info.device)
        d = info.devices
        for inst in range(math.ceil(count / d)):
            on_node = min(d, count - inst * d)
            for j in range(on_node):
                workers.append(flops_worker(
                    f"{name}#{inst}/{j}", model, peak, f, link_gbps=info.network_gbps / on_node,
                    node=f"{name}#{inst}", storage_mbps=storage_mbps, usd_per_hour=price / on_node,
                    kind=name, device=info.device))
    return workers


def profile_workers(profile: dict) -> list[WorkerModel]:
    """Workers from a hetflow profile: a_i, c_i as the planner reads them (`fitted_step_model`).

    The profile times the step through DDP, as training runs it, so nothing is added for DDP's
    work in backward. Each rank's link is its measured all-reduce bus bandwidth (a
    `Network.link_gbps` overrides it); every rank its own node (the local emulation gives each
    worker its own link). Storage is left out: training reads its shards through the local cache
    once, then from memory.
    """
    ranks = sorted(profile.get("ranks") or [], key=lambda r: r["rank"])
    if not ranks:
        raise SimulationError("profile: it holds no ranks")
    out = []
    for r in ranks:
        try:
            (a,), (c,) = fitted_step_model([r])
        except (KeyError, TypeError, ZeroDivisionError):
            raise SimulationError(f"profile: rank {r.get('rank')} lacks fit_latency_s / fit_s_per_sample") from None
        out.append(WorkerModel(name=str(r.get("worker", f"rank{r['rank']}")), latency_s=a, per_sample_s=c,
                               link_gbps=r.get("allreduce_gbps") or None, node=f"rank{r['rank']}",
                               cap=r.get("memory_cap_batch") or None,
                               kind=str(r.get("instance_type") or r.get("worker") or "profiled")))
    return out


def profile_alpha_s(profile: dict) -> float:
    """Per-hop alpha from a profile: the slowest rank's all-reduce latency over its 2(n-1) hops."""
    ranks = profile.get("ranks") or []
    n = len(ranks)
    if n < 2:
        return 0.0
    return max(float(r.get("allreduce_latency_s") or 0.0) for r in ranks) / (2 * (n - 1))


def replicate(workers: Sequence[WorkerModel], n: int) -> list[WorkerModel]:
    """n workers cycling through `workers` (a measured mix at another size)."""
    check_workers(n)
    base = list(workers)
    return [replace(base[i % len(base)], name=f"{base[i % len(base)].name}.{i // len(base)}",
                    node=f"{base[i % len(base)].node or base[i % len(base)].name}.{i // len(base)}")
            for i in range(n)]


# -- the published tables -------------------------------------------------------------------

# What the issue quotes from the field: data-parallel ResNet-50 on V100s, minutes per epoch on
# 1, 2, 4, 8 GPUs; scaling efficiency at 16, 64, 256, 1024 nodes.
PUBLISHED_V100_EPOCH_MIN = {1: 220.0, 2: 112.0, 4: 58.0, 8: 30.0}
PUBLISHED_EFFICIENCY = {
    "resnet50": {16: 0.95, 64: 0.89, 256: 0.78, 1024: 0.62},
    "bert-large": {16: 0.93, 64: 0.86, 256: 0.72, 1024: 0.55},
}


@dataclass(frozen=True)
class PublishedSetup:
    """The stated assumptions one row of the published comparison runs on."""

    model: str
    device: str
    local_batch: int
    link_gbps: float
    alpha_s: float
    fraction: float
    compression_ratio: float = 1.0
    note: str = ""

    def workers(self, n: int) -> list[WorkerModel]:
        model = MODELS[self.model]
        peak = DEVICE_PEAK_TFLOPS[self.device]
        one = flops_worker("w", model, peak, self.fraction, link_gbps=self.link_gbps, device=self.device)
        return [replace(one, name=f"w{i}", node=f"n{i}") for i in range(n)]

    def job(self) -> Job:
        return Job(MODELS[self.model], local_batch=self.local_batch)

    def network(self) -> Network:
        return Network(alpha_s=self.alpha_s, compression_ratio=self.compression_ratio)

    def assumptions(self) -> dict:
        m = MODELS[self.model]
        net = self.network()
        nbytes = m.grad_bytes / self.compression_ratio
        return {
            "model": self.model, "params": m.params, "per_sample_gflop": m.per_sample_flops / 1e9,
            "epoch_samples": m.epoch_samples, "device": self.device,
            "device_peak_tflops_fp32": DEVICE_PEAK_TFLOPS[self.device], "achieved_fraction": self.fraction,
            "local_batch": self.local_batch, "gradient_mb": nbytes / 1e6,
            "buckets_per_step": net.buckets(nbytes), "collective": "ring, one worker per node",
            "link_gbps": self.link_gbps, "alpha_us_per_hop": self.alpha_s * 1e6, "overlap": 0.0,
            "note": self.note,
        }


def v100_fraction_from_epoch(minutes: float = PUBLISHED_V100_EPOCH_MIN[1]) -> float:
    """The achieved FP32 fraction a V100 needs for ResNet-50 to take `minutes` per epoch alone."""
    m = MODELS["resnet50"]
    samples_per_s = m.epoch_samples / (minutes * 60)
    return samples_per_s * m.per_sample_flops / (DEVICE_PEAK_TFLOPS["V100"] * 1e12)


RESNET_SETUP = PublishedSetup(
    model="resnet50", device="V100", local_batch=64, link_gbps=25.0, alpha_s=40e-6,
    fraction=round(v100_fraction_from_epoch(), 4),
    note="achieved fraction taken from their 1-GPU row (220 min/epoch = 97 img/s = 7.6% of FP32 "
         "peak); one V100 per node on 25 Gbit/s Ethernet; FP32 gradients in DDP's 25 MB buckets; "
         "alpha = 40 us per hop per bucket (TCP, software all-reduce) is the one figure not from a "
         "datasheet or their table: a round value that puts the 16- and 1024-node ends near theirs",
)
BERT_SETUP = PublishedSetup(
    model="bert-large", device="V100", local_batch=32, link_gbps=100.0, alpha_s=12e-6,
    fraction=0.3,
    note="one V100 per node on 100 Gbit/s; FP32 gradients (1.36 GB, 53 buckets); 30% of V100 FP32 "
         "peak (18 sequences/s per GPU at sequence 128) and alpha = 12 us per hop per bucket "
         "(RDMA-class fabric) are not from a datasheet: round values that put the 16- and "
         "1024-node ends near theirs; the middle rows are predictions",
)


def published_comparison(resnet: PublishedSetup = RESNET_SETUP, bert: PublishedSetup = BERT_SETUP) -> dict:
    """Ours beside theirs: ResNet-50 minutes per epoch on 1-8 V100s, efficiency at 16-1024 nodes."""
    epoch_rows = []
    job, net = resnet.job(), resnet.network()
    for n, theirs in PUBLISHED_V100_EPOCH_MIN.items():
        p = simulate_step(resnet.workers(n), job, net, "baseline")
        ours = p.epoch_time_s / 60
        epoch_rows.append({"gpus": n, "theirs_min": theirs, "ours_min": ours, "rel_error": ours / theirs - 1,
                           "ours_efficiency": p.efficiency})
    eff_rows = []
    for setup in (resnet, bert):
        job, net = setup.job(), setup.network()
        for n, theirs in PUBLISHED_EFFICIENCY[setup.model].items():
            p = simulate_step(setup.workers(n), job, net, "baseline")
            eff_rows.append({"model": setup.model, "nodes": n, "theirs": theirs, "ours": p.efficiency,
                             "rel_error": p.efficiency / theirs - 1, "comm_share": p.exposed_comm_s / p.step_time_s})
    return {
        "resnet50_v100_epoch": epoch_rows,
        "scaling_efficiency": eff_rows,
        "assumptions": {"resnet50": resnet.assumptions(), "bert-large": bert.assumptions()},
    }
