"""MLflow: one run per training run, a parent run per comparison. Written once, by the driver.

The ranks return their figures to the flow; this module writes them after training, so the
writing never stalls a training step. `MLFLOW_TRACKING_URI` wins over the embedded default, a
SQLite file under HETFLOW_HOME.
"""

from __future__ import annotations

import json
import os
import socket
import tempfile
import time
from contextlib import contextmanager
from pathlib import Path

import mlflow
from mlflow.entities import Metric, Param
from mlflow.tracking import MlflowClient
from prefect import runtime

from hetflow.config import ClusterSpec, DatasetSpec, TrackingConfig, TrainConfig
from hetflow.infra.paths import home
from hetflow.tasks import plots

BATCH = 500  # MLflow accepts up to 1000 metrics per log_batch call


def tracking_uri(cfg: TrackingConfig) -> str:
    return cfg.tracking_uri or os.environ.get("MLFLOW_TRACKING_URI") or f"sqlite:///{home() / 'mlflow.db'}"


def experiment_id(client: MlflowClient, cfg: TrackingConfig) -> str:
    exp = client.get_experiment_by_name(cfg.experiment)
    if exp is not None:
        return exp.experiment_id
    location = None
    if client.tracking_uri.startswith("sqlite:"):
        location = (home() / "mlartifacts").as_uri()
    return client.create_experiment(cfg.experiment, artifact_location=location)


def client_for(cfg: TrackingConfig) -> MlflowClient:
    uri = tracking_uri(cfg)
    mlflow.set_tracking_uri(uri)
    return MlflowClient(uri)


def flatten(prefix: str, value) -> dict[str, str]:
    if isinstance(value, dict):
        out: dict[str, str] = {}
        for k, v in value.items():
            out.update(flatten(f"{prefix}.{k}" if prefix else str(k), v))
        return out
    if isinstance(value, list) and value and isinstance(value[0], dict):
        return {f"{prefix}.{i}.{k}": v for i, item in enumerate(value) for k, v in flatten("", item).items()}
    return {prefix: json.dumps(value) if isinstance(value, list) else str(value)}


def _flow_run_tags() -> dict[str, str]:
    tags = {}
    run_id = runtime.flow_run.id
    if run_id:
        tags["prefect_flow_run_id"] = str(run_id)
        url = runtime.flow_run.ui_url
        if url and os.environ.get("PREFECT_API_URL"):
            tags["prefect_flow_run_url"] = url
    return tags


def _log_json(client: MlflowClient, run_id: str, name: str, data) -> None:
    with tempfile.TemporaryDirectory() as d:
        path = Path(d) / name
        path.write_text(json.dumps(data, indent=1, default=str))
        client.log_artifact(run_id, str(path))


def open_training_run(
    tracking: TrackingConfig,
    variant: str,
    cluster: ClusterSpec,
    dataset: DatasetSpec,
    train: TrainConfig,
    plan: dict,
    run_dir: Path,
    parent_run_id: str | None = None,
) -> str:
    """Create the variant's run before training (so system metrics land in it), or reopen the
    one a previous attempt of the same flow run created (its id is kept in the run directory)."""
    client = client_for(tracking)
    marker = run_dir / "mlflow_run_id"
    if marker.exists():
        return marker.read_text().strip()
    tags = {"variant": variant, "cluster": cluster.name, "dataset": dataset.url, **_flow_run_tags()}
    if parent_run_id:
        tags["mlflow.parentRunId"] = parent_run_id
    run = client.create_run(experiment_id(client, tracking), run_name=variant, tags=tags)
    rid = run.info.run_id
    params = {
        **flatten("cluster", cluster.model_dump()),
        **flatten("dataset", dataset.model_dump()),
        **flatten("train", train.model_dump()),
        **flatten("plan", plan),
    }
    _log_params(client, rid, params)
    marker.write_text(rid)
    return rid


@contextmanager
def system_metrics(run_id: str, interval_s: float = 2.0):
    """MLflow's own CPU/memory (and GPU where present) sampling into the run, tagged by node."""
    from mlflow.system_metrics.system_metrics_monitor import SystemMetricsMonitor

    mlflow.system_metrics.set_system_metrics_node_id(socket.gethostname())
    monitor = SystemMetricsMonitor(run_id, sampling_interval=interval_s, samples_before_logging=1)
    monitor.start()
    try:
        yield
    finally:
        monitor.finish()


def finish_training_run(
    tracking: TrackingConfig, run_id: str, outcome: dict, profile: dict, train: TrainConfig, register_as: str
) -> None:
    """Figures, per-step series, the profile and plan, plots and the model; then FINISHED."""
    client = client_for(tracking)
    now_ms = int(time.time() * 1000)
    # Run figures at the final step: per-rank names double as per-step series, and MLflow
    # shows a metric's value at its highest step.
    final = int(outcome["metrics"]["steps"])
    metrics = [Metric(k, float(v), now_ms, final) for k, v in outcome["metrics"].items()]
    for row in outcome["series"]:
        metrics += [Metric(k, float(v), now_ms, row["step"]) for k, v in row.items() if k != "step"]
    metrics += [Metric("test_accuracy", e["accuracy"], now_ms, e["step"]) for e in outcome["evals"]]
    for i in range(0, len(metrics), BATCH):
        client.log_batch(run_id, metrics=metrics[i : i + BATCH])
    client.set_tag(run_id, "compression_reason", outcome["plan"]["compression_reason"])
    _log_json(client, run_id, "profile.json", profile)
    _log_json(client, run_id, "plan.json", {"initial": outcome["plan"], "plans": outcome["plans"],
                                             "replans": outcome["replans"]})
    with tempfile.TemporaryDirectory() as d:
        title = f"{outcome['variant']}"
        plots.timeline(outcome["rank_records"], Path(d) / "timeline.png", title=f"{title}: per-rank timeline")
        plots.step_series(outcome["series"], Path(d) / "steps.png", title=f"{title}: step time and plan")
        for name in ("timeline.png", "steps.png"):
            client.log_artifact(run_id, str(Path(d) / name), artifact_path="plots")
    _log_model(run_id, outcome, train, register_as)
    client.set_terminated(run_id)


def _log_model(run_id: str, outcome: dict, train: TrainConfig, register_as: str) -> None:
    import mlflow.pytorch
    import numpy as np
    import torch

    from hetflow.training.models import build_model

    state = Path(outcome["run_dir"]) / "model.pt"
    if not state.exists():
        return
    model = build_model(train.model)
    model.load_state_dict(torch.load(state))
    model.eval()
    accuracy = outcome["metrics"].get("final_accuracy", 0.0)
    register = (outcome["variant"] == "optimized" and train.target_accuracy is not None
                and accuracy >= train.target_accuracy)
    example = np.zeros((1, 64), dtype=np.float32)
    with mlflow.start_run(run_id=run_id):
        mlflow.pytorch.log_model(
            model, name="model", input_example=example,
            pip_requirements=[f"torch=={torch.__version__.split('+')[0]}"],
            registered_model_name=register_as if register else None,
        )


def _log_params(client: MlflowClient, run_id: str, params: dict[str, str]) -> None:
    items = [Param(k, v[:6000]) for k, v in params.items()]
    for i in range(0, len(items), 100):
        client.log_batch(run_id, params=items[i : i + 100])


def start_parent_run(tracking: TrackingConfig, cluster: ClusterSpec, dataset: DatasetSpec) -> str:
    client = client_for(tracking)
    tags = {"variant": "compare", "cluster": cluster.name, "dataset": dataset.url, **_flow_run_tags()}
    run = client.create_run(experiment_id(client, tracking), run_name="compare", tags=tags)
    return run.info.run_id


def finish_parent_run(
    tracking: TrackingConfig, run_id: str, table: dict, markdown: str, baseline: dict, optimized: dict
) -> None:
    client = client_for(tracking)
    _log_json(client, run_id, "comparison.json", table)
    with tempfile.TemporaryDirectory() as d:
        plots.busy_comparison(baseline, optimized, Path(d) / "busy_fraction.png")
        client.log_artifact(run_id, str(Path(d) / "busy_fraction.png"), artifact_path="plots")
    with tempfile.TemporaryDirectory() as d:
        path = Path(d) / "comparison.md"
        path.write_text(markdown)
        client.log_artifact(run_id, str(path))
    client.set_terminated(run_id)


def read_run_metrics(tracking: TrackingConfig, run_id: str) -> tuple[str, dict[str, float]]:
    client = client_for(tracking)
    run = client.get_run(run_id)
    return run.data.tags.get("variant", run_id[:8]), dict(run.data.metrics)
