"""One synchronous data-parallel step, predicted: the all-reduce, the plan, the slowest worker.

    step = max_i (data_i + compute_i) x (1 + jitter x z_n) + overhead + exposed_comm

Pure functions of the `job` dataclasses (the formulas: docs/benchmarks.md). The one
step-time predictor: `allreduce_s` (the gradient's all-reduce over nodes of workers) and
`step_time` (the slowest worker, jitter, overhead and the all-reduce left exposed) serve the
simulator (`simulate_step`, on affine workers; `sweep` runs it for several worker counts and
plans) and the rental search (`rent.search`, on step-time curves) alike.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from statistics import NormalDist

from hetflow.forecast.simulate.job import (
    DEFAULT_INTRA_GBPS,
    INTRA_NODE_GBPS,
    Job,
    ModelSpec,
    Network,
    SimulationError,
    WorkerModel,
    check_workers,
)
from hetflow.perf.collective import outer_allreduce_time, ring_allreduce_time
from hetflow.training.plan.balance import balance_batches, equal_batches

PLANS = ("baseline", "optimized")


@dataclass(frozen=True)
class StepPrediction:
    """One step of one plan on n workers, and the epoch and cost it implies."""

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
        """The prediction as one row of `hetflow simulate --json` (local batches left out)."""
        return {
            "workers": self.workers,
            "plan": self.plan,
            "throughput_samples_per_s": self.throughput_samples_per_s,
            "efficiency": self.efficiency,
            "epoch_time_s": self.epoch_time_s,
            "cost_per_epoch": self.cost_per_epoch,
            "global_batch": self.global_batch,
            "step_time_s": self.step_time_s,
            "compute_s": self.compute_s,
            "comm_s": self.comm_s,
            "exposed_comm_s": self.exposed_comm_s,
            "data_wait_s": self.data_wait_s,
            "idle_fraction": self.idle_fraction,
            "usd_per_hour": self.usd_per_hour,
        }


# -- communication ----------------------------------------------------------------------------


@dataclass(frozen=True)
class NodeGroup:
    """`nodes` nodes of `devices` workers each: one node's network (`nic_gbps`, all its workers
    together; infinite: loopback) and its bus between its workers (`intra_gbps`)."""

    devices: int
    nodes: int
    nic_gbps: float
    intra_gbps: float


def allreduce_s(groups: Sequence[NodeGroup], grad_bytes: float, network: Network) -> float:
    """Seconds one step's gradient all-reduce takes over these nodes (all its buckets): one
    ring over every worker, its slowest edge (a node's NIC between nodes, a node's bus inside
    one) setting the pace; or, hierarchical, a ring inside each node and one across them."""
    n = sum(g.devices * g.nodes for g in groups)
    if n <= 1:
        return 0.0
    nbytes = grad_bytes / network.compression_ratio
    k = network.buckets(nbytes)
    n_nodes = sum(g.nodes for g in groups)
    widest = max(g.devices for g in groups)
    if network.collective == "ring" or n_nodes == 1 or widest == 1:
        edges = [g.nic_gbps for g in groups] if n_nodes > 1 else []
        edges += [g.intra_gbps for g in groups if g.devices > 1]
        alpha = network.alpha_s if n_nodes > 1 else network.intra_alpha_s
        # an infinite bandwidth leaves alpha
        if network.collective == "hierarchical" and n_nodes > 1:  # averaged every H steps
            return outer_allreduce_time(nbytes, n, alpha, min(edges), network.average_every, k)
        return ring_allreduce_time(nbytes, n, alpha, min(edges), k)
    # hierarchical: reduce-scatter in each node, ring across nodes, all-gather in each node
    intra = max(
        ring_allreduce_time(nbytes, g.devices, network.intra_alpha_s, g.intra_gbps, k)
        for g in groups
    )
    nic = min(g.nic_gbps for g in groups)
    return intra + outer_allreduce_time(
        nbytes, n_nodes, network.alpha_s, nic, network.average_every, k
    )


def _intra_gbps(group: Sequence[WorkerModel], network: Network) -> float:
    if network.intra_gbps is not None:
        return network.intra_gbps
    return min(INTRA_NODE_GBPS.get(w.device, DEFAULT_INTRA_GBPS) for w in group)


def _nic_gbps(group: Sequence[WorkerModel], network: Network) -> float:
    shares = [network.link_gbps or w.link_gbps for w in group]
    if any(s is None for s in shares):
        return math.inf  # an unlimited link (loopback)
    return sum(shares)


def node_groups(workers: Sequence[WorkerModel], network: Network) -> list[NodeGroup]:
    """The workers by node (`node`, else each its own), each node one NodeGroup."""
    nodes: dict[str, list[WorkerModel]] = {}
    for w in workers:
        nodes.setdefault(w.node or w.name, []).append(w)
    return [
        NodeGroup(len(grp), 1, _nic_gbps(grp, network), _intra_gbps(grp, network))
        for grp in nodes.values()
    ]


def allreduce_time(workers: Sequence[WorkerModel], grad_bytes: float, network: Network) -> float:
    """Seconds one step's gradient all-reduce takes on these workers (all its buckets)."""
    return allreduce_s(node_groups(workers, network), grad_bytes, network)


# -- one step ---------------------------------------------------------------------------------


_NORMAL = NormalDist()


def expected_max_normal(n: int) -> float:
    """E[max of n standard normals] (Blom's approximation; 0 for n = 1)."""
    if n <= 1:
        return 0.0
    return _NORMAL.inv_cdf((n - 0.375) / (n + 0.25))


def step_time(
    slowest_s: float, compute_s: float, comm_s: float, n: int, job: Job, network: Network
) -> tuple[float, float, float]:
    """(The step, its slowest worker stretched by jitter, the all-reduce left exposed) of n
    workers whose slowest takes `slowest_s` (data wait and compute; `compute_s` its compute
    alone, which the all-reduce may overlap by `network.overlap`) and an all-reduce of
    `comm_s`.

    >>> from hetflow.forecast.simulate.models import MODELS
    >>> step_time(0.2, 0.2, 0.05, 4, Job(MODELS["resnet50"], global_batch=64), Network())
    (0.25, 0.2, 0.05)
    """
    slowest = slowest_s * (1 + job.jitter * expected_max_normal(n))
    exposed = max(0.0, comm_s - network.overlap * compute_s)
    return slowest + job.step_overhead_s + exposed, slowest, exposed


def plan_batches_for(workers: Sequence[WorkerModel], global_batch: int, plan: str) -> list[int]:
    """The local batches of a plan: `baseline` equal split, `optimized` hetflow's balance."""
    n = len(workers)
    if plan == "baseline":
        return equal_batches(n, global_batch)
    if plan == "optimized":
        return balance_batches(
            [w.per_sample_s for w in workers],
            [w.latency_s for w in workers],
            global_batch,
            [w.cap for w in workers],
        )
    raise SimulationError(f"plan: {plan!r} is not one of {', '.join(PLANS)}")


def _data_wait(w: WorkerModel, batch: float, model: ModelSpec, prefetch: bool) -> float:
    if w.storage_mbps is None or batch <= 0:
        return 0.0
    read = batch * model.sample_bytes * 8 / (w.storage_mbps * 1e6)
    return max(0.0, read - w.compute_s(batch)) if prefetch else read


def _ideal_samples_per_s(workers: Sequence[WorkerModel], job: Job, ref: float) -> float:
    """What the workers would do alone at local batch `ref`, summed (communication-free)."""
    ideal = 0.0
    for w in workers:
        alone = _data_wait(w, ref, job.model, job.prefetch) + w.compute_s(ref) + job.step_overhead_s
        ideal += ref / alone
    return ideal


def simulate_step(
    workers: Sequence[WorkerModel],
    job: Job,
    network: Network,
    plan: str = "baseline",
    batches: Sequence[int] | None = None,
) -> StepPrediction:
    """Predict one synchronous step (and its epoch and cost) for a plan on these workers.

    `batches` replaces the plan's local batches (a run whose plan is known).
    """
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
    comm = allreduce_time(workers, model.grad_bytes, network)
    compute_only = max(w.compute_s(bi) for w, bi in zip(workers, b, strict=True))
    step, slowest_jittered, exposed = step_time(slowest, compute_only, comm, n, job, network)
    throughput = gb / step
    ideal = _ideal_samples_per_s(workers, job, gb / n)
    idle = sum(slowest_jittered - t for t in busy) / (n * step)
    usd = sum(w.usd_per_hour for w in workers)
    epoch = model.epoch_samples / throughput
    return StepPrediction(
        workers=n,
        plan=plan,
        local_batches=b,
        global_batch=gb,
        step_time_s=step,
        compute_s=slowest,
        comm_s=comm,
        exposed_comm_s=exposed,
        data_wait_s=max(waits),
        idle_fraction=idle,
        throughput_samples_per_s=throughput,
        ideal_samples_per_s=ideal,
        efficiency=throughput / ideal,
        epoch_time_s=epoch,
        usd_per_hour=usd,
        cost_per_epoch=usd * epoch / 3600,
    )


def sweep(
    cluster_at: Callable[[int], Sequence[WorkerModel]],
    counts: Sequence[int],
    job: Job,
    network: Network,
    plans: Sequence[str] = PLANS,
) -> list[StepPrediction]:
    """simulate_step for each worker count (cluster_at(n) -> workers) and plan."""
    out = []
    for n in counts:
        check_workers(n)
        workers = cluster_at(n)
        for plan in plans:
            out.append(simulate_step(workers, job, network, plan))
    return out
