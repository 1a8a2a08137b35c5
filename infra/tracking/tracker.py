"""MLflow: one run per training run, a parent run per comparison, one per profile.

`MLflowTracker` is the only writer and reader of MLflow in hetflow, used by the driver (tasks,
flows, CLI). The ranks return their figures to the flow, which has them written after
training, so that writing never stalls a training step. The tracking URI: the config's, else
`MLFLOW_TRACKING_URI`, else a SQLite file under HETFLOW_HOME (its artifacts beside it).
"""

from __future__ import annotations

import json
import os
import socket
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from contextlib import contextmanager
from functools import cached_property
from pathlib import Path

import mlflow
from mlflow.entities import Metric, Param
from mlflow.environment_variables import (
    MLFLOW_DEFAULT_PREDICTION_DEVICE,
    MLFLOW_SUPPRESS_PRINTING_URL_TO_STDOUT,
)
from mlflow.exceptions import MlflowException
from mlflow.tracking import MlflowClient
from pydantic import BaseModel

from hetflow.config import ClusterSpec, DatasetSpec, TrackingConfig, TrainConfig
from hetflow.infra.paths import home
from hetflow.infra.report import plots
from hetflow.infra.tracking import links
from hetflow.records import Plan

METRICS_PER_BATCH = 500  # MLflow accepts up to 1000 metrics per log_batch call
PARAMS_PER_BATCH = 100  # MLflow's limit per log_batch call
PARAM_CHARS = 6000  # MLflow's limit on a param value's length
# torch.export (under MLflow's log_model) keeps global state: runs recorded from threads of one
# process (the queue's segments) log their models one at a time
_EXPORTING = threading.Lock()
# MLflow 3's experiment kind: its UI opens a model-training experiment on the runs table, a
# GenAI one on an overview of traces (3.17's UI decides by its own view switch instead; the
# links in `links` select that view)
EXPERIMENT_KIND = "mlflow.experimentKind"
MODEL_TRAINING = "custom_model_development"
NOTE = "mlflow.note.content"  # a run's description in the MLflow UI (markdown)
# what the variants of a comparison share, as the parent run's params
COMPARISON_KNOBS = (
    "recipe",
    "steps",
    "global_batch",
    "seed",
    "target_accuracy",
    "target_val_loss",
    "optimizer",
    "lr",
    "strategy",
)

Draw = Callable[[Path], object]  # draws a figure into the file it is given


def lr_params(train: TrainConfig) -> dict[str, str]:
    """The learning rate a resolved `train` runs at (`training.loop.optim`), as params:
    `lr_base` (at the tuned batch), `lr_tuned_batch`, `lr_scaling`, `lr_scaled` (at the global
    batch) and `lr_warmup_steps`; none for a config not resolved yet.

    >>> t = TrainConfig(lr=0.05, lr_scaling="linear", lr_tuned_batch=128, lr_warmup_steps=50)
    >>> lr_params(t.model_copy(update={"global_batch": 256}))["lr_scaled"]
    '0.1'
    """
    if train.lr is None or train.lr_scaling is None:
        return {}
    return {
        "lr_base": str(train.lr),
        "lr_tuned_batch": str(train.lr_tuned_batch),
        "lr_scaling": train.lr_scaling,
        "lr_scaled": str(train.scaled_lr()),
        "lr_warmup_steps": str(train.lr_warmup_steps),
    }


class RunNotFound(LookupError):
    """A run id the tracking store does not hold; the message names the id and the store."""


def flatten(prefix: str, value) -> dict[str, str]:
    """A nested config as MLflow params: `cluster.workers.0.speed` -> '1.0' (lists as JSON)."""
    if isinstance(value, dict):
        out: dict[str, str] = {}
        for k, v in value.items():
            out.update(flatten(f"{prefix}.{k}" if prefix else str(k), v))
        return out
    if isinstance(value, list) and value and isinstance(value[0], dict):
        return {
            f"{prefix}.{i}.{k}": v
            for i, item in enumerate(value)
            for k, v in flatten("", item).items()
        }
    return {prefix: json.dumps(value) if isinstance(value, list) else str(value)}


class MLflowTracker:
    """Runs in one MLflow experiment (`TrackingConfig.experiment`), created on first use.

    Every run is tagged `variant` (also its name), `cluster`, `dataset`, `recipe` and, inside a
    Prefect flow run, `prefect_flow_run_id` (and `prefect_flow_run_url` when a Prefect API is set).
    """

    def __init__(self, config: TrackingConfig):
        self.config = config
        self.tracking_uri = (
            config.tracking_uri
            or os.environ.get("MLFLOW_TRACKING_URI")
            or f"sqlite:///{home() / 'mlflow.db'}"
        )

    @cached_property
    def client(self) -> MlflowClient:
        """The MLflow client (made on first use; also sets mlflow's global tracking URI, which
        `log_model` and system metrics write through)."""
        mlflow.set_tracking_uri(self.tracking_uri)
        return MlflowClient(self.tracking_uri)

    def experiment_id(self) -> str:
        """The experiment's id; created, marked as model training, on first use. An
        experiment without a kind (made before hetflow marked them) is marked too."""
        exp = self.client.get_experiment_by_name(self.config.experiment)
        if exp is not None:
            if EXPERIMENT_KIND not in exp.tags:
                self.client.set_experiment_tag(exp.experiment_id, EXPERIMENT_KIND, MODEL_TRAINING)
            return exp.experiment_id
        location = None
        if self.tracking_uri.startswith("sqlite:"):
            location = (home() / "mlartifacts").as_uri()
        try:
            return self.client.create_experiment(
                self.config.experiment,
                artifact_location=location,
                tags={EXPERIMENT_KIND: MODEL_TRAINING},
            )
        except MlflowException:
            # a run started at the same time created it first: use theirs
            exp = self.client.get_experiment_by_name(self.config.experiment)
            if exp is None:
                raise
            return exp.experiment_id

    @staticmethod
    def flow_run_tags() -> dict[str, str]:
        """The Prefect flow run this code runs in, as MLflow tags; none outside a flow run.

        Code inside a flow run has imported Prefect; elsewhere (`hetflow compare`) there is no
        run to tag, and importing Prefect only to learn that costs most of a second."""
        if "prefect" not in sys.modules:
            return {}
        from prefect import runtime

        tags = {}
        run_id = runtime.flow_run.id
        if run_id:
            tags["prefect_flow_run_id"] = str(run_id)
            url = runtime.flow_run.ui_url
            if url and os.environ.get("PREFECT_API_URL"):
                tags["prefect_flow_run_url"] = url
        return tags

    # -- runs ---------------------------------------------------------------------------------

    def start_run(
        self,
        variant: str,
        cluster: ClusterSpec,
        dataset: DatasetSpec,
        parent_run_id: str | None = None,
        recipe: str | None = None,
    ) -> str:
        """A new run named `variant`, with the tags above (and `recipe` and a parent, if
        given); its id."""
        tags = {
            "variant": variant,
            "cluster": cluster.name,
            "dataset": dataset.url,
            **({"recipe": recipe} if recipe else {}),
            **self.flow_run_tags(),
        }
        if parent_run_id:
            tags["mlflow.parentRunId"] = parent_run_id
        run = self.client.create_run(self.experiment_id(), run_name=variant, tags=tags)
        return run.info.run_id

    def open_variant_run(
        self,
        variant: str,
        cluster: ClusterSpec,
        dataset: DatasetSpec,
        train: TrainConfig,
        plan: Plan,
        run_dir: Path,
        parent_run_id: str | None = None,
    ) -> str:
        """The variant's run, created before training (so that system metrics land in it) with
        the job as params (and `lr_params` of a resolved `train`), or the one a previous
        attempt of the same flow run created: its id is kept in `run_dir/mlflow_run_id`."""
        marker = run_dir / "mlflow_run_id"
        if marker.exists():
            return marker.read_text().strip()
        rid = self.start_run(variant, cluster, dataset, parent_run_id, train.recipe)
        self.log_params(
            rid,
            {
                **flatten("cluster", cluster.model_dump()),
                **flatten("dataset", dataset.model_dump()),
                **flatten("train", train.model_dump()),
                **flatten("plan", plan.model_dump(mode="json")),
                **lr_params(train),
            },
        )
        marker.write_text(rid)
        return rid

    def start_comparison(
        self, cluster: ClusterSpec, dataset: DatasetSpec, configs: Mapping[str, TrainConfig]
    ) -> str:
        """The parent run of a comparison (variant `compare`; the variants, trained as
        `configs`, are its children), with the job as params: `cluster`, `workers`,
        `world_size`, `dataset`, `recipe`, `steps`, `global_batch`, ..., and each variant's
        `{variant}.schedule` and `{variant}.compression`."""
        first = next(iter(configs.values()))
        rid = self.start_run("compare", cluster, dataset, recipe=first.recipe)
        params = {
            "cluster": cluster.name,
            "workers": ", ".join(plots.rank_labels(cluster)),
            "world_size": str(cluster.world_size),
            "dataset": dataset.url,
            "dataset_source": dataset.source,
            **{k: str(getattr(first, k)) for k in COMPARISON_KNOBS},
        }
        for variant, cfg in configs.items():
            params[f"{variant}.schedule"] = cfg.schedule
            params[f"{variant}.compression"] = cfg.compression
        self.log_params(rid, params)
        return rid

    def finish(self, run_id: str) -> None:
        """Mark the run FINISHED."""
        self.client.set_terminated(run_id)

    def fail(self, run_id: str, message: str, tags: Mapping[str, str] | None = None) -> None:
        """Mark the run FAILED, with why: `message` as the run's description and as
        `failure.txt`, and `tags` (e.g. `failed_rank`)."""
        self.client.set_tag(run_id, "mlflow.note.content", f"```\n{message}\n```")
        for key, value in (tags or {}).items():
            self.client.set_tag(run_id, key, value)
        self.log_text(run_id, "failure.txt", message)
        self.client.set_terminated(run_id, status="FAILED")

    def read_metrics(self, run_id: str) -> tuple[str, dict[str, float]]:
        """(the run's `variant` tag, or its id's first 8 characters; its latest metrics).

        Raises RunNotFound if the store holds no run `run_id`; a SQLite store that does not
        exist yet holds none, and is not created by asking.
        """
        missing = RunNotFound(f"no run {run_id!r} in MLflow at {self.tracking_uri}")
        if self.tracking_uri.startswith("sqlite:///"):
            path = self.tracking_uri.removeprefix("sqlite:///")
            if path != ":memory:" and not Path(path).exists():
                raise missing
        try:
            run = self.client.get_run(run_id)
        except MlflowException as e:
            if e.error_code in ("RESOURCE_DOES_NOT_EXIST", "INVALID_PARAMETER_VALUE"):
                raise missing from None
            raise
        return run.data.tags.get("variant", run_id[:8]), dict(run.data.metrics)

    # -- writing ------------------------------------------------------------------------------

    def log_params(self, run_id: str, params: Mapping[str, str]) -> None:
        """Params in batches, each value cut to MLflow's limit."""
        items = [Param(k, v[:PARAM_CHARS]) for k, v in params.items()]
        for i in range(0, len(items), PARAMS_PER_BATCH):
            self.client.log_batch(run_id, params=items[i : i + PARAMS_PER_BATCH])

    def log_metrics(self, run_id: str, values: Mapping[str, float], step: int = 0) -> None:
        """Metrics, all at one step, in batches."""
        now_ms = int(time.time() * 1000)
        self._log_points(run_id, [Metric(k, float(v), now_ms, step) for k, v in values.items()])

    def log_series(self, run_id: str, rows: Iterable[Mapping[str, float]]) -> None:
        """Per-step metrics: each row holds `step` and the metrics at that step."""
        now_ms = int(time.time() * 1000)
        points = [
            Metric(k, float(v), now_ms, int(row["step"]))
            for row in rows
            for k, v in row.items()
            if k != "step"
        ]
        self._log_points(run_id, points)

    def _log_points(self, run_id: str, points: list[Metric]) -> None:
        for i in range(0, len(points), METRICS_PER_BATCH):
            self.client.log_batch(run_id, metrics=points[i : i + METRICS_PER_BATCH])

    def log_json(self, run_id: str, name: str, data) -> None:
        """`data` (pydantic models as their JSON) as the artifact `name`."""
        if isinstance(data, BaseModel):
            data = data.model_dump(mode="json")
        self.log_text(run_id, name, json.dumps(data, indent=1, default=str))

    def log_text(self, run_id: str, name: str, text: str) -> None:
        with tempfile.TemporaryDirectory() as d:
            path = Path(d) / name
            path.write_text(text)
            self.client.log_artifact(run_id, str(path))

    def log_plots(
        self, run_id: str, figures: Mapping[str, Draw], artifact_path: str = "plots"
    ) -> None:
        """Each figure drawn into a file of its name, logged under `artifact_path`."""
        with tempfile.TemporaryDirectory() as d:
            for name, draw in figures.items():
                draw(Path(d) / name)
                self.client.log_artifact(run_id, str(Path(d) / name), artifact_path=artifact_path)

    def log_model(
        self, run_id: str, model, input_example, registered_name: str | None = None
    ) -> None:
        """A torch model as the run's logged model `model` (registered under `registered_name`
        if given), pinned to this torch release. Leaves the run FINISHED.

        `input_example` is a batch of more than one sample: torch.export fixes a dimension of
        size 1 to that size (and warns), so the logged model would take one sample at a time.

        The model is exported on the CPU, and an exported model's weights cannot move: MLflow's
        pyfunc loader, which picks the GPU wherever CUDA is available, refuses it there. So its
        input example is checked on the CPU (`MLFLOW_DEFAULT_PREDICTION_DEVICE`), and on a GPU
        host it loads with `mlflow.pyfunc.load_model(uri, model_config={"device": "cpu"})`
        (`mlflow.pytorch.load_model` loads it as is).
        """
        import mlflow.pytorch
        import torch

        mlflow.set_tracking_uri(self.tracking_uri)
        # Ending the run (leaving `start_run`) prints MLflow's "View run" lines, as `finish`
        # does after this: printed by `finish` alone, each line appears once.
        with (
            _EXPORTING,
            _env(MLFLOW_SUPPRESS_PRINTING_URL_TO_STDOUT.name, "true"),
            _env(MLFLOW_DEFAULT_PREDICTION_DEVICE.name, "cpu"),
            mlflow.start_run(run_id=run_id),
        ):
            mlflow.pytorch.log_model(
                model,
                name="model",
                input_example=input_example,
                pip_requirements=[f"torch=={torch.__version__.split('+')[0]}"],
                registered_model_name=registered_name,
            )

    @contextmanager
    def system_metrics(self, run_id: str, interval_s: float = 2.0):
        """MLflow's own sampling of this host into the run: CPU, memory, disk, network and,
        where nvidia-ml-py finds a GPU (the `gpu` extra), each GPU's utilization and memory, as
        `system/HOST/...`. The run's tag `gpu_metrics` says whether GPU figures are sampled
        (`nvml`, `rocm`) or not (`none`). Under Ray each node samples itself
        (`training.node_metrics`)."""
        from mlflow.system_metrics.metrics.gpu_monitor import GPUMonitor
        from mlflow.system_metrics.metrics.rocm_monitor import ROCMMonitor
        from mlflow.system_metrics.system_metrics_monitor import SystemMetricsMonitor

        mlflow.set_tracking_uri(self.tracking_uri)  # the monitor logs through mlflow's global URI
        mlflow.system_metrics.set_system_metrics_node_id(socket.gethostname())
        monitor = SystemMetricsMonitor(
            run_id, sampling_interval=interval_s, samples_before_logging=1
        )
        kinds = {GPUMonitor: "nvml", ROCMMonitor: "rocm"}
        gpu = next((kinds[type(m)] for m in monitor.monitors if type(m) in kinds), "none")
        self.client.set_tag(run_id, "gpu_metrics", gpu)
        monitor.start()
        try:
            yield
        finally:
            monitor.finish()

    def links_markdown(self, runs: Mapping[str, str]) -> str:
        """`links.links_markdown` for runs of this experiment (label -> run id), with the
        Prefect flow run this code runs in, if any."""
        return links.links_markdown(
            self.tracking_uri,
            self.experiment_id(),
            runs,
            self.flow_run_tags().get("prefect_flow_run_url"),
        )

    def run_url(self, run_id: str) -> str:
        """The run's page in the MLflow UI (`links.run_url`)."""
        return links.run_url(self.tracking_uri, self.experiment_id(), run_id)


@contextmanager
def _env(name: str, value: str):
    """os.environ[name] = value for the context; what was there before is put back."""
    saved = os.environ.get(name)
    os.environ[name] = value
    try:
        yield
    finally:
        if saved is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = saved
