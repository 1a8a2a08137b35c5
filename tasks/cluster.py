"""Profiling and training tasks: each launches torchrun on the cluster."""

from __future__ import annotations

import datetime as dt
import uuid
from pathlib import Path

from prefect import task

from hetflow.config import ClusterSpec, DatasetSpec, TrainConfig
from infra.paths import runs_dir
from training.job import RunSpec
from training.launch import run_workers
from training.metrics import step_series, summarize
from training.planning import Plan, make_plan


def new_run_dir(label: str) -> Path:
    stamp = dt.datetime.now().strftime("%Y%m%d-%H%M%S")
    path = runs_dir() / f"{stamp}-{label}-{uuid.uuid4().hex[:6]}"
    path.mkdir(parents=True)
    return path


@task(task_run_name="profile {cluster.name} ({cluster.world_size} workers)")
def profile_workers(cluster: ClusterSpec, dataset: DatasetSpec, train: TrainConfig) -> dict:
    """Measure every worker inside the cluster: fwd+bwd speed on the job's model, all-reduce."""
    run_dir = new_run_dir("profile")
    spec = RunSpec(run_name=run_dir.name, variant="profile", mode="profile", cluster=cluster,
                   dataset=dataset, train=train, run_dir=str(run_dir))
    result, wall = run_workers(spec)
    ranks = sorted(result["ranks"], key=lambda r: r["rank"])
    fastest = max(r["samples_per_s"] for r in ranks)
    for r, w in zip(ranks, cluster.workers, strict=True):
        r["worker"] = w.name
        r["relative_speed"] = r["samples_per_s"] / fastest
    profile = {"cluster": cluster.name, "model": train.model, "ranks": ranks, "profiling_time_s": wall}
    speeds = ", ".join(f"{r['worker']}={r['relative_speed']:.2f}" for r in ranks)
    print(f"profiled {cluster.world_size} workers in {wall:.1f}s; relative speeds {speeds}")
    return profile


@task(task_run_name="train {variant}")
def train_variant(
    variant: str, cluster: ClusterSpec, dataset: DatasetSpec, train: TrainConfig, profile: dict
) -> dict:
    """Plan, run torchrun, and return figures, the per-step series and where the outputs are."""
    plan: Plan = make_plan(profile, cluster, train)
    run_dir = new_run_dir(variant)
    spec = RunSpec(run_name=run_dir.name, variant=variant, cluster=cluster, dataset=dataset,
                   train=train, plan=plan.local_batches, compression=plan.compression,
                   compression_reason=plan.compression_reason, latency_s=plan.latency_s,
                   run_dir=str(run_dir))
    print(f"{variant}: local batches {plan.local_batches}, compression {plan.compression} "
          f"({plan.compression_reason}); training {train.steps} steps")
    result, wall = run_workers(spec)
    metrics = summarize(result, train.global_batch, train.target_accuracy)
    metrics["run_time_s"] = wall
    print(f"{variant}: {metrics['throughput_samples_per_s']:.0f} samples/s, "
          f"accuracy {metrics.get('final_accuracy', float('nan')):.3f}, {wall:.0f}s with launch")
    return {
        "variant": variant,
        "plan": plan.model_dump(),
        "metrics": metrics,
        "series": step_series(result, train.global_batch),
        "evals": result["ranks"][0]["evals"],
        "plans": result["ranks"][0]["plans"],
        "replans": result["ranks"][0]["replans"],
        "run_dir": str(run_dir),
    }
