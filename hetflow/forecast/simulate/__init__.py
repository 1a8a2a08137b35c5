"""The scale simulator (pure: no infra, no torch): what synchronous data-parallel training does
at 1 to 1024 workers. A step is the slowest worker's data wait and compute (a_i + c_i x b_i,
from a profile or from FLOPs and the device's peak), stretched by straggler jitter, plus a fixed
overhead and the all-reduce's exposed alpha-beta cost; from it, throughput, scaling efficiency
and time and cost per epoch of the equal split (`baseline`) and hetflow's plan (`optimized`).
The model term by term: docs/benchmarks.md; its error: docs/measurements/simulator.md.

Modules: `models` (the models' figures), `memory` (the largest local batch a device holds),
`job` (the job, the workers, the network), `step` (one step, a sweep: the one step-time
predictor), `clusters` (workers from a catalog or a profile), `published` (published throughput
tables: fit rows, held-out error), `report` (`hetflow simulate`'s tables and plot). The names
below are the simulator's API; the rental search (`hetflow.forecast.rent`) prices mixes with
the same step.
"""

from hetflow.forecast.simulate.clusters import (
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
from hetflow.forecast.simulate.job import (
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
from hetflow.forecast.simulate.published import (
    TABLES,
    PublishedTable,
    published_comparison,
)
from hetflow.forecast.simulate.step import (
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
    "DDP_BUCKET_BYTES",
    "DDP_FIRST_BUCKET_BYTES",
    "DEFAULT_INTRA_GBPS",
    "INTRA_NODE_GBPS",
    "MAX_WORKERS",
    "MIB",
    "MODELS",
    "PLANS",
    "TABLES",
    "Job",
    "ModelSpec",
    "Network",
    "PublishedTable",
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
    "replicate",
    "resized",
    "ring_allreduce_time",
    "scale_counts",
    "simulate_step",
    "spec_cluster",
    "spec_instance_types",
    "sweep",
]
