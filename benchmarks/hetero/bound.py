"""The bound a variant is graded against, measured in the same invocation, not modelled.

Each worker is timed alone (the others not launched, its own emulated speed kept) at every
local batch the round's plans gave it. A plan's step is at least its slowest worker's
b_i / r_i(b_i), so no plan of global batch G exceeds the sum of its workers' measured rates
r_i(b_i); over every plan, no more than the sum of each worker's best measured rate
(`bound_samples_per_s`). With the profile's measured all-reduce of one gradient each step:
`bound_with_allreduce_samples_per_s`.
"""

from __future__ import annotations

from hetflow.config import DatasetSpec
from hetflow.records import Plan
from hetflow.training.launch.run import run_plan
from hetflow.training.metrics import summarize

BOUND_STEPS = 12  # a worker timed alone: the first step (DDP's bucket rebuild) is not counted


def solo_rate(bench, worker: int, batch: int, dataset: DatasetSpec, run_dir: str) -> float:
    """Worker `worker` of `bench.cluster` alone, `batch` samples a step: its samples/s over
    the steps after the first (`throughput_samples_per_s`)."""
    names = [w.name for w in bench.cluster.workers]
    plan = Plan(
        local_batches=[batch if j == worker else 0 for j in range(len(names))],
        dropped=[n for j, n in enumerate(names) if j != worker],
    )
    cfg = bench.base.model_copy(
        update={
            "global_batch": batch,
            "steps": BOUND_STEPS,
            "schedule": "equal",
            "compression": "none",
            "eval_every": BOUND_STEPS,
            "checkpoint_every": BOUND_STEPS + 1,
            "target_accuracy": None,
            "target_val_loss": None,
        }
    )
    ran = run_plan(bench.cluster, plan, cfg, dataset, run_dir, variant="bound")
    return summarize(ran.result, batch).throughput_samples_per_s


def solo_rates(
    bench, plans: list[list[int]], dataset: DatasetSpec, tmp: str, round_: int
) -> dict[tuple[int, int], float]:
    """(worker, batch) -> samples/s, for every batch above 0 that `plans` (over the whole
    cluster) give a worker, each timed alone once."""
    pairs = sorted({(i, b) for plan in plans for i, b in enumerate(plan) if b > 0})
    out = {}
    for i, b in pairs:
        out[(i, b)] = solo_rate(bench, i, b, dataset, f"{tmp}/bound-{round_}-w{i}-b{b}")
        print(f"bound: w{i} alone at batch {b}: {out[(i, b)]:.0f} samples/s", flush=True)
    return out


def bound_figures(
    throughput: float, plan: list[int], rates: dict, global_batch: int, allreduce_s: float
) -> dict[str, float]:
    """A variant's figures against the measured bound (pure): the bound over every plan (each
    worker's best measured rate, summed), the bound of its own plan (its workers' rates at
    their shares), the first with the all-reduce, and its throughput over each.

    >>> rates = {(0, 8): 100.0, (0, 16): 120.0, (1, 16): 300.0}
    >>> f = bound_figures(300.0, [16, 16], rates, 32, 0.0)
    >>> f["bound_samples_per_s"], f["plan_bound_samples_per_s"], f["efficiency_vs_bound"]
    (420.0, 420.0, 0.7142857142857143)
    """
    best: dict[int, float] = {}
    for (i, _), r in rates.items():
        best[i] = max(best.get(i, 0.0), r)
    bound = sum(best.values())
    own = sum(rates[(i, b)] for i, b in enumerate(plan) if b > 0 and (i, b) in rates)
    with_ar = global_batch / (global_batch / bound + allreduce_s)
    return {
        "bound_samples_per_s": bound,
        "plan_bound_samples_per_s": own,
        "bound_with_allreduce_samples_per_s": with_ar,
        "efficiency_vs_bound": throughput / bound,
        "efficiency_vs_bound_with_allreduce": throughput / with_ar,
    }
