"""The training task: plan a variant from the profile, run it on the cluster, record it."""

from __future__ import annotations

from pathlib import Path

from prefect import runtime, task
from prefect.artifacts import create_progress_artifact, update_progress_artifact

from hetflow.config import ClusterSpec, ConfigError, DatasetSpec, TrackingConfig, TrainConfig
from hetflow.infra.catalog import Catalog, cost_usd
from hetflow.infra.datasets import read_manifest
from hetflow.infra.paths import new_run_dir, runs_dir
from hetflow.infra.tracking.content import record_training
from hetflow.infra.tracking.plots import rank_labels
from hetflow.infra.tracking.tracker import MLflowTracker
from hetflow.records import Plan, Profile, RunResult, TrainOutcome
from hetflow.training.job import RunSpec
from hetflow.training.launch import LaunchError, RankFailed, run_workers
from hetflow.training.metrics import step_series, summarize
from hetflow.training.optim import resolve_optimizer
from hetflow.training.planning import launched, launched_ranks, make_plan
from hetflow.training.recipes import DataInfo, Recipe, check_recipe, seeded_model
from hetflow.training.scheduler import PlanError


def stable_run_dir(label: str) -> Path:
    """One directory per (flow run, label): a retried task finds its checkpoints there."""
    flow_run = runtime.flow_run.id
    if not flow_run:
        return new_run_dir(label)
    path = runs_dir() / f"{flow_run}-{label}"
    path.mkdir(parents=True, exist_ok=True)
    return path


def worth_retrying(task, task_run, state) -> bool:
    """Prefect retries a lost torchrun job, not a rank's own exception nor bad input found
    before launch (a ConfigError or PlanError of the plan): both are deterministic."""
    try:
        state.result()
    except (RankFailed, ConfigError, PlanError):
        return False
    except Exception:
        return True
    return True


def _will_retry(e: LaunchError) -> bool:
    """Whether Prefect runs this train task again after `e` (see `worth_retrying`)."""
    if isinstance(e, RankFailed) or not runtime.task_run.id:
        return False
    return runtime.task_run.run_count <= train_variant.retries


def failure_tags(e: LaunchError) -> dict[str, str]:
    """The failed run's tags: the rank, step and exception when a rank raised."""
    if not isinstance(e, RankFailed):
        return {"failure": "torchrun"}
    f = e.failure
    step = "" if f.step is None else str(f.step)
    return {
        "failure": f.kind,
        "failed_rank": str(f.rank),
        "failed_step": step,
        "failed_exception": f.exception,
    }


@task(
    task_run_name="train {variant}",
    retries=1,
    retry_delay_seconds=5,
    retry_condition_fn=worth_retrying,
)
def train_variant(
    variant: str,
    cluster: ClusterSpec,
    dataset: DatasetSpec,
    train: TrainConfig,
    profile: Profile,
    tracking: TrackingConfig,
    parent_run_id: str | None = None,
    catalog: Catalog | None = None,
    epoch_samples: int | None = None,
) -> TrainOutcome:
    """Plan, run torchrun with MLflow system metrics on, then record the run in MLflow.

    `variant` labels the run (MLflow run name and tag, run directory); `train` is what runs.
    Idempotent: a retry (or a re-run of the same flow run) reuses the run directory, so the
    workers resume from the last checkpoint and the same MLflow run is completed.
    """
    manifest = read_manifest(dataset.url)
    recipe = check_recipe(train, manifest)
    train = resolve_optimizer(train, recipe)  # MLflow's params name the optimizer that ran
    plan: Plan = make_plan(profile, cluster, train)
    ranks, ranks_plan, _ = launched(cluster, plan)  # the workers launched: all but plan.dropped
    run_dir = stable_run_dir(variant)
    spec = RunSpec(
        run_name=run_dir.name,
        variant=variant,
        cluster=ranks,
        dataset=dataset,
        train=train,
        plan=ranks_plan,
        run_dir=str(run_dir),
    )
    _print_plan(variant, plan, train)
    tracker = MLflowTracker(tracking)
    run_id = tracker.open_variant_run(
        variant, cluster, dataset, train, plan, run_dir, parent_run_id
    )
    raw, wall = launch(spec, tracker, run_id)
    result = RunResult.model_validate(raw)
    ran = finished_on(plan, result)
    metrics = summarize(result, train.global_batch, train.target_accuracy, train.target_val_loss)
    metrics["run_time_s"] = wall
    metrics.update(cost_metrics(launched(cluster, ran)[0], metrics, train, catalog, epoch_samples))
    outcome = TrainOutcome(
        variant=variant,
        run_id=run_id,
        run_dir=str(run_dir),
        plan=plan,
        metrics=on_cluster_ranks(metrics, cluster, ran),
        series=[
            on_cluster_ranks(row, cluster, ran) for row in step_series(result, train.global_batch)
        ],
        result=result,
    )
    info = DataInfo.from_manifest(manifest)
    name = f"hetflow-{dataset.source}"
    record_outcome(tracker, outcome, profile, train, name, ranks, (recipe, info))
    _print_outcome(variant, result, metrics, wall)
    return outcome


def finished_on(plan: Plan, result: RunResult) -> Plan:
    """`plan` with the workers the run went on without (`Recovery.left_out`: a lost node under
    Ray) among its `dropped` too, so that the result's ranks map onto the cluster's workers;
    a left-out worker's figures are not in the result, only the ranks that finished."""
    left = [w for w in result.lead.recovery.left_out if w not in plan.dropped]
    return plan.model_copy(update={"dropped": [*plan.dropped, *left]}) if left else plan


def launched_labels(cluster: ClusterSpec, outcome: TrainOutcome, profile: Profile) -> list[str]:
    """The labels of the ranks `outcome`'s variant finished on (all but its plan's dropped and
    the workers a lost node took: `finished_on`), in the order of the result's ranks."""
    return rank_labels(launched(cluster, finished_on(outcome.plan, outcome.result))[0], profile)


def _print_plan(variant: str, plan: Plan, train: TrainConfig) -> None:
    """The plan as the run's log says it (MLflow holds it too: the params plan.*)."""
    print(
        f"{variant}: local batches {plan.local_batches}, compression "
        f"{'auto' if plan.compression_candidates else plan.compression} "
        f"({plan.compression_reason}); training {train.steps} steps"
    )
    for why in plan.excluded:
        print(f"{variant}: left out of the synchronous step: {why}")
    if plan.dropped:
        print(
            f"{variant}: not launched: {', '.join(plan.dropped)} (at batch 0 they would only "
            "add to every all-reduce; planning.drop_from_launch)"
        )


def on_cluster_ranks(figures: dict, cluster: ClusterSpec, plan: Plan) -> dict:
    """`figures` with each `rankR/` name renumbered from the ranks launched to the cluster's
    workers, so that a row of the comparison is one worker in both variants; a dropped worker
    gets local_batch and busy_fraction 0 (pure).

    >>> c = ClusterSpec.from_speeds([1, 4])
    >>> on_cluster_ranks({"rank0/local_batch": 64, "loss": 1.0}, c, Plan(local_batches=[0, 64],
    ...     dropped=["w0"]))
    {'rank1/local_batch': 64, 'loss': 1.0, 'rank0/local_batch': 0, 'rank0/busy_fraction': 0.0}
    """
    if not plan.dropped:
        return figures
    keep = launched_ranks(cluster, plan)
    out = {}
    for k, v in figures.items():
        head, sep, rest = k.partition("/")
        if sep and head.startswith("rank") and head[4:].isdigit():
            k = f"rank{keep[int(head[4:])]}/{rest}"
        out[k] = v
    for i, w in enumerate(cluster.workers):
        if w.name in plan.dropped:
            out |= {f"rank{i}/local_batch": 0, f"rank{i}/busy_fraction": 0.0}
    return out


def _print_outcome(variant: str, result: RunResult, metrics: dict, wall: float) -> None:
    """What 'auto' chose by trials (also in MLflow: compression_trials.json), and the
    headline figures."""
    trials = result.lead.trials
    if trials is not None:
        print(f"{variant}: compression 'auto' -> {trials.chosen} by trials: {trials.reason}")
    for worker, why in result.lead.recovery.left_out.items():
        print(f"{variant}: went on without {worker}: {why}")
    print(f"{variant}: {_headline(metrics)}, {wall:.0f}s with launch")


def _headline(metrics: dict) -> str:
    """'N samples/s, accuracy A' (or 'val_loss L')."""
    quality = (
        f"accuracy {metrics['final_accuracy']:.3f}"
        if "final_accuracy" in metrics
        else f"val_loss {metrics.get('final_val_loss', float('nan')):.3f}"
    )
    return f"{metrics['throughput_samples_per_s']:.0f} samples/s, {quality}"


def launch(spec: RunSpec, tracker: MLflowTracker, run_id: str) -> tuple[dict, float]:
    """run_workers with MLflow system metrics on and a Prefect progress artifact; on a
    failure the MLflow run is marked FAILED with why (the rank, step and exception)."""
    progress = _progress_reporter(spec.variant, spec.train.steps)
    # every node of a Ray cluster samples its own system metrics into the run (`node_metrics`)
    spec = spec.model_copy(update={"metrics_run": (tracker.tracking_uri, run_id)})
    with tracker.system_metrics(run_id):
        try:
            raw, wall = run_workers(spec, on_progress=progress)
        except LaunchError as e:
            if not _will_retry(e):  # a retry completes the same run
                tracker.fail(run_id, str(e), failure_tags(e))
            raise
    progress(spec.train.steps)
    return raw, wall


def record_outcome(
    tracker: MLflowTracker,
    outcome: TrainOutcome,
    profile: Profile,
    train: TrainConfig,
    register_as: str,
    cluster: ClusterSpec | None = None,
    recipe: tuple[Recipe, DataInfo] | None = None,
) -> None:
    """Figures, series, profile, plan and plots (ranks labelled by `cluster`'s workers, if
    given); the trained model of `recipe` (recipe, the data it read; default: `train`'s on
    digits), registered as `register_as` when the variant is `optimized` and met its target
    at its end; then the run is FINISHED."""
    record_training(tracker, outcome, profile, cluster)
    recipe, info = recipe or (check_recipe(train), DataInfo())
    model = _trained_model(Path(outcome.run_dir), recipe, info)
    if model is not None:
        register = outcome.variant == "optimized" and _met_target(outcome.metrics, train)
        tracker.log_model(
            outcome.run_id,
            model,
            model_input_example(recipe, info),
            register_as if register else None,
        )
    tracker.finish(outcome.run_id)


def _met_target(metrics: dict, train: TrainConfig) -> bool:
    """The run's final evaluation met the target of the figure the recipe evaluates."""
    if "final_accuracy" in metrics and train.target_accuracy is not None:
        return metrics["final_accuracy"] >= train.target_accuracy
    if "final_val_loss" in metrics and train.target_val_loss is not None:
        return metrics["final_val_loss"] <= train.target_val_loss
    return False


def model_input_example(recipe: Recipe | None = None, info: DataInfo | None = None):
    """The input example a trained model is logged with: two zero samples of the dataset's
    kind through `recipe.batch` (its first tensor; default: two digits images, flattened).
    Two, not one: torch.export fixes a batch dimension of size 1, and the logged model would
    then take one sample at a time (see MLflowTracker.log_model)."""
    import numpy as np

    info = info or DataInfo()
    if info.kind == "tokens":
        x = np.zeros((2, (recipe.context if recipe else 8) + 1), dtype=np.int64)
    elif info.kind == "images":
        x = np.zeros((2, *info.shape), dtype=np.uint8)
    else:
        x = np.zeros((2, info.features or 64), dtype=np.float32)
    if recipe is None:
        return x
    return recipe.batch(x, np.zeros(2, dtype=np.int64))[0].numpy()


def _trained_model(run_dir: Path, recipe: Recipe, info: DataInfo):
    """The model the workers saved in `run_dir/model.pt`, in eval mode; None if there is none."""
    import torch

    state = run_dir / "model.pt"
    if not state.exists():
        return None
    model = seeded_model(recipe, info, 0)
    model.load_state_dict(torch.load(state))
    model.eval()
    return model


def cost_metrics(
    cluster: ClusterSpec,
    metrics: dict,
    train: TrainConfig,
    catalog: Catalog | None,
    epoch_samples: int | None,
) -> dict[str, float]:
    """`cost_usd`, `cost_per_epoch_usd` and `rank{i}/cost_usd` of the training loop's time
    (`train_loop_s`; price x instance-hours, a GPU instance's price shared by its GPUs), when
    the workers name EC2 instance types; nothing for workers that name none (a local emulation
    has no price)."""
    if catalog is None or not catalog.types:
        return {}
    epochs = metrics["steps"] * train.global_batch / epoch_samples if epoch_samples else None
    cost = cost_usd(cluster, metrics["train_loop_s"], catalog, epochs=epochs)
    out = {"cost_usd": cost["total_usd"]}
    if cost.get("per_epoch_usd") is not None:
        out["cost_per_epoch_usd"] = cost["per_epoch_usd"]
    for i, w in enumerate(cluster.workers):
        out[f"rank{i}/cost_usd"] = cost["by_worker"][w.name]
    return out


def _progress_reporter(variant: str, steps: int):
    """A Prefect progress artifact for the run, updated as rank 0 completes steps."""
    state = {"id": None, "last": -1}

    def report(step: int) -> None:
        pct = round(100.0 * step / steps, 1)
        if pct == state["last"]:
            return
        try:
            if state["id"] is None:
                state["id"] = create_progress_artifact(
                    pct, key=f"train-{variant}", description=f"{variant}: steps completed"
                )
            else:
                update_progress_artifact(state["id"], pct)
            state["last"] = pct
        except Exception as e:
            print(f"progress artifact not updated: {type(e).__name__}")

    return report
