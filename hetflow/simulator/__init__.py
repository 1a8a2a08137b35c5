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
  profile times a step through DDP (`hetflow.training.probes.compute.solo_ddp`), so DDP's own
  work in backward
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

Modules: `model` (what is simulated), `step` (one step, a sweep), `clusters` (workers from the
EC2 catalog or a profile), `published` (the field's tables), `calibrate` (runs made here),
`cli` and `report` (`hetflow simulate`). The names below are the package's API.
"""

from hetflow.simulator.clusters import (
    as_profile,
    catalog_cluster,
    flops_worker,
    fraction_for,
    parse_mix,
    profile_alpha_s,
    profile_workers,
    replicate,
    resized,
    scale_counts,
    spec_cluster,
    spec_instance_types,
)
from hetflow.simulator.model import (
    DDP_BUCKET_BYTES,
    DDP_FIRST_BUCKET_BYTES,
    DEFAULT_INTRA_GBPS,
    INTRA_NODE_GBPS,
    MAX_WORKERS,
    MIB,
    MODELS,
    Job,
    ModelSpec,
    Network,
    SimulationError,
    WorkerModel,
    check_workers,
)
from hetflow.simulator.published import (
    BERT_SETUP,
    PUBLISHED_EFFICIENCY,
    PUBLISHED_V100_EPOCH_MIN,
    RESNET_SETUP,
    PublishedSetup,
    published_comparison,
    published_gap,
    v100_fraction_from_epoch,
)
from hetflow.simulator.step import (
    PLANS,
    StepPrediction,
    allreduce_time,
    expected_max_normal,
    plan_batches_for,
    ring_allreduce_time,
    simulate_step,
    sweep,
)

__all__ = [
    "BERT_SETUP",
    "DDP_BUCKET_BYTES",
    "DDP_FIRST_BUCKET_BYTES",
    "DEFAULT_INTRA_GBPS",
    "INTRA_NODE_GBPS",
    "MAX_WORKERS",
    "MIB",
    "MODELS",
    "PLANS",
    "PUBLISHED_EFFICIENCY",
    "PUBLISHED_V100_EPOCH_MIN",
    "RESNET_SETUP",
    "Job",
    "ModelSpec",
    "Network",
    "PublishedSetup",
    "SimulationError",
    "StepPrediction",
    "WorkerModel",
    "allreduce_time",
    "as_profile",
    "catalog_cluster",
    "check_workers",
    "expected_max_normal",
    "flops_worker",
    "fraction_for",
    "parse_mix",
    "plan_batches_for",
    "profile_alpha_s",
    "profile_workers",
    "published_comparison",
    "published_gap",
    "replicate",
    "resized",
    "ring_allreduce_time",
    "scale_counts",
    "simulate_step",
    "spec_cluster",
    "spec_instance_types",
    "sweep",
    "v100_fraction_from_epoch",
]
