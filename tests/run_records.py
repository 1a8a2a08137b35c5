"""Run records as the workers return them (`RunResult`), and the figures the train task makes
of them, for the tests of the comparison table and its notes."""

from __future__ import annotations

from hetflow.config import ClusterSpec
from hetflow.records import EvalPoint, Plan, RankResult, Recovery, RunResult, StepRecord
from hetflow.training.metrics import summarize
from hetflow.training.plan.ranks import RankMap

CLUSTER = ClusterSpec.from_speeds([1, 1, 2, 4])
EQUAL = Plan.equal([32, 32, 32, 32])


def run_of(
    batches: list[list[int]],
    step_s: float,
    comm_s: float = 0.01,
    accuracies: tuple[float, ...] = (0.5, 0.8),
    left_out: dict[str, str] | None = None,
) -> RunResult:
    """A run of len(batches) steps, `batches[i]` each rank's local batch at step i (a re-plan
    changes them): every rank computes in proportion to its batch, communicates `comm_s` (none
    on one rank) and idles the rest; rank 0 evaluates `accuracies`, evenly spaced."""
    world = len(batches[0])
    comm = comm_s if world > 1 else 0.0
    out = []
    for r in range(world):
        records = []
        for i, step in enumerate(batches):
            compute = (step_s - comm - 0.001) * step[r] / max(step)
            records.append(
                StepRecord(
                    step=i,
                    batch=step[r],
                    data_s=0.001,
                    compute_s=compute,
                    wait_s=step_s - compute - 0.001,
                    step_s=step_s,
                    loss_sum=2.0 * step[r] / (i + 1),
                    bytes_sent=1e6 if world > 1 else 0.0,
                    idle_s=step_s - compute - 0.001 - comm,
                    comm_s=comm,
                )
            )
        every = len(batches) // len(accuracies)
        evals = [
            EvalPoint(step=(k + 1) * every, train_time_s=(k + 1) * every * step_s, accuracy=a)
            for k, a in enumerate(accuracies)
        ]
        out.append(
            RankResult(
                rank=r,
                records=records,
                plans=[],
                evals=evals if r == 0 else [],
                recovery=Recovery(left_out=left_out or {}),
            )
        )
    return RunResult(ranks=out)


def figures_of(result: RunResult, cluster: ClusterSpec, plan: Plan, target=0.95) -> dict:
    """The run's figures under their MLflow names, as the train task records them:
    `summarize`, ranks numbered as the cluster's workers (one not launched at batch 0)."""
    return RankMap(cluster, plan).to_cluster(summarize(result, 128, target_accuracy=target)).flat()


CLUSTER = ClusterSpec.from_speeds([1, 1, 2, 4])
EQUAL = Plan.equal([32, 32, 32, 32])
