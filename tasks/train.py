"""The training task: plan a variant from the profile, run it on the cluster, record it."""

from __future__ import annotations

import contextlib
import re
from collections.abc import Iterator
from pathlib import Path

from prefect import runtime, task
from prefect.artifacts import create_progress_artifact, update_progress_artifact

from hetflow.config import (
    ClusterSpec,
    ConfigError,
    DatasetSpec,
    FaultPolicy,
    TrackingConfig,
    TrainConfig,
)
from hetflow.figures import RunMetrics
from hetflow.infra.catalog import Catalog, with_cost
from hetflow.infra.data.format import read_manifest
from hetflow.infra.paths import new_run_dir, runs_dir
from hetflow.infra.report.plots import rank_rows
from hetflow.infra.tracking.content import record_training
from hetflow.infra.tracking.tracker import MLflowTracker
from hetflow.records import Plan, Profile, RunResult, TrainOutcome
from hetflow.tasks.history import store_learned
from hetflow.training.devices import Placement
from hetflow.training.job import ResolvedJob
from hetflow.training.launch.agents import agent_pool
from hetflow.training.launch.outcome import LaunchError, RankFailed
from hetflow.training.launch.pool import WarmPool
from hetflow.training.launch.run import Ran, run_plan
from hetflow.training.loop.optim import is_resolved, resolve_optimizer
from hetflow.training.metrics import (
    end_to_end,
    met_target,
    needs_profile,
    step_series,
    summarize,
)
from hetflow.training.plan.balance import PlanError
from hetflow.training.plan.planner import make_plan
from hetflow.training.plan.ranks import RankMap
from hetflow.training.plan.rounds import loop_counts, resolve_rounds
from hetflow.training.recipes import DataInfo, Recipe, recipe_of
from hetflow.training.recipes.export import input_example, trained_model


@contextlib.contextmanager
def warm_agents(cluster: ClusterSpec, launches: int) -> Iterator[WarmPool | None]:
    """torchrun's agents kept warm for the `launches` jobs a flow runs in turn on this host
    (`training.launch.agents.agent_pool`: each imports while the job before it trains);
    none under Ray, whose own processes run the ranks."""
    with agent_pool(launches if cluster.launcher == "local" else 0) as pool:
        yield pool


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


def _will_retry(e: LaunchError, faults: FaultPolicy) -> bool:
    """Whether Prefect runs this train task again after `e` (see `worth_retrying`), as
    `train_task(faults)` retries it."""
    if isinstance(e, RankFailed) or not runtime.task_run.id:
        return False
    return runtime.task_run.run_count <= faults.task_retries


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


_DEFAULT_FAULTS = FaultPolicy()


@task(
    task_run_name="train {variant}",
    retries=_DEFAULT_FAULTS.task_retries,
    retry_delay_seconds=_DEFAULT_FAULTS.task_retry_delay_s,
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
    data: DataInfo | None = None,
    job: ResolvedJob | None = None,
) -> TrainOutcome:
    """Plan, run torchrun with MLflow system metrics on, then record the run in MLflow.

    `variant` labels the run (MLflow run name and tag, run directory); `train`, what runs, as
    the flow resolved it (`training.job`; else here), its diloco rounds derived from the plan
    here; `data`, what the flow read (else read here); `job`, the flow's resolved job, whose
    recipe and placement on this host it takes (`ResolvedJob.placement_of`; else resolved
    here). Idempotent: a retry reuses the run
    directory, so the workers resume from the last checkpoint and the same MLflow run is
    completed. Flows call it as `train_task(train.faults)`, retried as its policy says.
    """
    train, recipe, data = _as_given(train, dataset, data, job)
    plan: Plan = make_plan(profile, cluster, train)
    train = resolve_rounds(train, plan)  # under diloco: what the loop counts, carried
    run_dir = stable_run_dir(variant)
    _print_plan(variant, plan, train)
    tracker = MLflowTracker(tracking)
    run_id = tracker.open_variant_run(
        variant, cluster, dataset, train, plan, run_dir, parent_run_id
    )
    placement = job.placement_of(cluster) if job else None
    ran = launch(variant, cluster, plan, train, dataset, run_dir, tracker, run_id, placement)
    metrics = summarize(
        ran.result, train.global_batch, train.target_accuracy, train.target_val_loss
    )
    profiled = profile.profiling_time_s if needs_profile(train) else 0.0
    metrics = end_to_end(metrics, ran.wall_s, profiled)
    finished_cluster = ran.ranks.launched()[0]
    if train.schedule == "dynamic":  # it ran its workers at the batches its plans gave them
        store_learned(finished_cluster, dataset, train, ran.result)
    turn = loop_counts(train).global_batch  # a round's samples under diloco
    metrics = with_cost(finished_cluster, metrics, turn, catalog, epoch_samples)
    outcome = TrainOutcome(
        variant=variant,
        run_id=run_id,
        run_dir=str(run_dir),
        plan=plan,
        metrics=ran.ranks.to_cluster(metrics),
        series=[ran.ranks.to_cluster(row) for row in step_series(ran.result, train.global_batch)],
        result=ran.result,
    )
    record_training(tracker, outcome, profile, finished_cluster)
    register = variant == "optimized" and met_target(outcome.metrics, train)
    name = f"hetflow-{dataset.source}" if register else None
    log_trained_model(tracker, outcome, (recipe, data), name)
    tracker.finish(run_id)
    _print_outcome(variant, ran.result, metrics, ran.wall_s)
    return outcome


def _as_given(
    train: TrainConfig, dataset: DatasetSpec, data: DataInfo | None, job: ResolvedJob | None
) -> tuple[TrainConfig, Recipe, DataInfo]:
    """`train` (resolved where the caller did not: MLflow's params name the optimizer that
    ran), its recipe (the `job`'s, else made here), and the kind of data the run reads
    (`data`, else the manifest's)."""
    # checked, with the data, at the flow's entry (`resolve_job`)
    recipe = job.recipe if job is not None else recipe_of(train)
    if not is_resolved(train):
        train = resolve_optimizer(train, recipe)
    return train, recipe, data or DataInfo.from_manifest(read_manifest(dataset.url))


def train_task(faults: FaultPolicy):
    """`train_variant` retried as the failure policy says: `task_retries` times,
    `task_retry_delay_s` after a failure (`worth_retrying` decides which failures)."""
    return train_variant.with_options(
        retries=faults.task_retries, retry_delay_seconds=faults.task_retry_delay_s
    )


def log_trained_model(
    tracker: MLflowTracker,
    outcome: TrainOutcome,
    recipe: tuple[Recipe, DataInfo],
    register_as: str | None,
) -> None:
    """The model the ranks saved, rebuilt by its recipe (and the data it read), logged to the
    variant's run (registered as `register_as`, if given); nothing if no model was saved."""
    model = trained_model(outcome.run_dir, *recipe)
    if model is not None:
        tracker.log_model(outcome.run_id, model, input_example(*recipe), register_as)


def launched_labels(cluster: ClusterSpec, outcome: TrainOutcome, profile: Profile) -> list[str]:
    """The labels of the ranks `outcome`'s variant finished on (all but its plan's dropped and
    the workers a lost node took: `RankMap.finished`), in rank order, each the worker it ran
    as (`plots.rank_rows`: not its position, which a leave in place shifts)."""
    ranks = RankMap(cluster, outcome.plan).finished(outcome.result)
    labels = rank_rows(outcome.result, ranks.launched()[0], profile)[1] or []
    return labels[: len(outcome.result.ranks)]


def _print_plan(variant: str, plan: Plan, train: TrainConfig) -> None:
    """The plan as the run's log says it (MLflow holds it too: the params plan.*)."""
    print(
        f"{variant}: local batches {plan.local_batches}, compression "
        f"{'auto' if plan.compression_candidates else plan.compression} "
        f"({plan.compression_reason}); training {train.steps} steps"
    )
    if any(c > 1 for c in plan.micro_count):
        print(
            f"{variant}: micro-batches per step {plan.micro_count} of at most "
            f"{plan.micro_batch} samples (train.accumulate 'auto')"
        )
    for why in plan.excluded:
        print(f"{variant}: left out of the synchronous step: {why}")
    if plan.dropped:
        print(
            f"{variant}: not launched: {', '.join(plan.dropped)} (at batch 0 they would only "
            "add to every all-reduce; planner.drop_from_launch)"
        )


def _print_outcome(variant: str, result: RunResult, metrics: RunMetrics, wall: float) -> None:
    """What 'auto' chose by trials (also in MLflow: compression_trials.json), and the
    headline figures."""
    trials = result.lead.trials
    if trials is not None:
        print(f"{variant}: compression 'auto' -> {trials.chosen} by trials: {trials.reason}")
    for worker, why in result.lead.recovery.left_out.items():
        print(f"{variant}: went on without {worker}: {why}")
    print(f"{variant}: {_headline(metrics)}, {wall:.0f}s with launch")


def _headline(m: RunMetrics) -> str:
    """'N samples/s, accuracy A' (or 'val_loss L')."""
    quality = (
        f"accuracy {m.final_accuracy:.3f}"
        if m.final_accuracy is not None
        else f"val_loss {m.final_val_loss if m.final_val_loss is not None else float('nan'):.3f}"
    )
    return f"{m.throughput_samples_per_s:.0f} samples/s, {quality}"


def launch(
    variant: str,
    cluster: ClusterSpec,
    plan: Plan,
    train: TrainConfig,
    dataset: DatasetSpec,
    run_dir: Path,
    tracker: MLflowTracker,
    run_id: str,
    placement: Placement | None = None,
) -> Ran:
    """`run_plan` with MLflow system metrics on and a Prefect progress artifact (`placement`:
    its own); on a failure the MLflow run is marked FAILED with why (the rank, step and
    exception)."""
    steps = loop_counts(train).steps
    progress = _progress_reporter(variant, steps)
    # every node of a Ray cluster samples its own system metrics into the run (`node_metrics`)
    with tracker.system_metrics(run_id):
        try:
            ran = run_plan(
                cluster,
                plan,
                train,
                dataset,
                run_dir,
                variant=variant,
                metrics_run=(tracker.tracking_uri, run_id),
                on_progress=progress,
                placement=placement,
            )
        except LaunchError as e:
            if not _will_retry(e, train.faults):  # a retry completes the same run
                tracker.fail(run_id, str(e), failure_tags(e))
            raise
    progress(steps)
    return ran


def _progress_reporter(variant: str, steps: int):
    """A Prefect progress artifact for the run, updated as rank 0 completes steps. Its key is
    the variant's name as Prefect allows keys: lowercase letters, digits and dashes."""
    state = {"id": None, "last": -1}
    key = re.sub(r"[^a-z0-9-]+", "-", f"train-{variant}".lower())

    def report(step: int) -> None:
        pct = min(100.0, round(100.0 * step / steps, 1))
        if pct == state["last"]:
            return
        try:
            if state["id"] is None:
                state["id"] = create_progress_artifact(
                    pct, key=key, description=f"{variant}: steps completed"
                )
            else:
                update_progress_artifact(state["id"], pct)
            state["last"] = pct
        except Exception as e:
            print(f"progress artifact not updated: {type(e).__name__}")

    return report
