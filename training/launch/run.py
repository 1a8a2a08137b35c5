"""From a plan to a result: the one path the train task, the benchmarks and the calibration take.

    ran = run_plan(cluster, make_plan(profile, cluster, train), train, dataset, run_dir,
                   variant="optimized")
    ran.result, ran.wall_s, ran.ranks.to_cluster(figures)

The workers the plan drops are not launched; the others run as ranks renumbered in order
(`RankMap`), under torchrun or Ray Train as the cluster's `launcher` says (`run_workers`).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from hetflow.config import ClusterSpec, DatasetSpec, TrainConfig
from hetflow.records import Plan, RunResult
from hetflow.training.launch.local import run_workers
from hetflow.training.launch.spec import RunSpec
from hetflow.training.plan.ranks import RankMap, Stragglers


@dataclass(frozen=True)
class Ran:
    """A finished run: its result (`raw`, result.json as the ranks wrote it), its wall time
    with launch, and the map of the ranks it finished on to the cluster's workers."""

    result: RunResult
    wall_s: float
    ranks: RankMap
    raw: dict


def run_plan(
    cluster: ClusterSpec,
    plan: Plan,
    train: TrainConfig,
    dataset: DatasetSpec,
    run_dir: str | Path,
    *,
    variant: str,
    stragglers: Stragglers | None = None,
    metrics_run: tuple[str, str] | None = None,
    on_progress=None,
    timeout_s: float = 1800,
) -> Ran:
    """Run `plan` (over every worker of `cluster`) to its result, its files under `run_dir`.

    `stragglers` (rank, step, factor) are numbered by the cluster's workers; `metrics_run`
    and `on_progress` are `RunSpec.metrics_run` and `run_workers`' own. Raises what
    `run_workers` raises (`LaunchError`, `RankFailed`, a ConfigError before launch)."""
    ranks = RankMap(cluster, plan)
    launched, launched_plan, moved = ranks.launched(stragglers)
    run_dir = Path(run_dir)
    spec = RunSpec(
        run_name=run_dir.name,
        variant=variant,
        cluster=launched,
        dataset=dataset,
        train=train,
        plan=launched_plan,
        stragglers=moved,
        run_dir=str(run_dir),
        metrics_run=metrics_run,
    )
    raw, wall = run_workers(spec, timeout_s=timeout_s, on_progress=on_progress)
    result = RunResult.model_validate(raw)
    return Ran(result, wall, ranks.finished(result), raw)
