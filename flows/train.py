"""Flow: plan (from a profile, or a prior the run learns from) and train one configuration on
the cluster; record it in MLflow."""

from __future__ import annotations

from prefect import flow
from pydantic.json_schema import SkipJsonSchema

from hetflow.config import (
    DatasetSpec,
    TrackingConfig,
    TrainConfig,
    default_cluster,
)
from hetflow.flows.forms import Cluster, Dataset, Train
from hetflow.tasks.history import profile_for
from hetflow.tasks.opening import Reached, ResolvedJob, opened
from hetflow.tasks.train import train_task

PRESETS = ("baseline", "optimized")


def run_label(train: TrainConfig) -> str:
    """'baseline' or 'optimized' when the schedule and compression are that preset's
    (`TrainConfig.variant`), else '<schedule>+<compression>', e.g. 'equal+fp16'."""
    knobs = train.model_dump(exclude={"schedule", "compression"})
    for name in PRESETS:
        if TrainConfig.variant(name, **knobs) == train:
            return name
    return f"{train.schedule}+{train.compression}"


# No flow-level retries: the train task retries a lost launch itself (`train.faults`), and a
# rank's own exception is deterministic (a retry would profile and fail again).
@flow(name="train", log_prints=True)
def train(
    train: Train = TrainConfig(),
    cluster: Cluster = default_cluster(),
    dataset: Dataset = DatasetSpec(),
    tracking: SkipJsonSchema[TrackingConfig] = TrackingConfig(),
    # out of the form (it labels the run, it does not change it), taken from the parameters
    variant: SkipJsonSchema[str | None] = "",
    job: SkipJsonSchema[ResolvedJob | None] = None,
    reached: SkipJsonSchema[Reached | None] = None,
) -> dict:
    """Train with `train` as given (its batch schedule and gradient communication included).

    `variant` only labels the run (MLflow run name and `variant` tag); empty: `run_label`.
    It is not in the form: a deployment's or a run's parameters set it.
    `tracking` (where runs are recorded) is left out of the form: the deployment's parameters
    or $MLFLOW_TRACKING_URI. `job` and `reached`: what the command that started the flow
    resolved and asked (`tasks.opening.opened`); none: the flow does both at its entry.
    Returns {"run_id": the MLflow run, "metrics": the run's figures}.
    """
    label = variant or run_label(train)
    with opened(cluster, [train], dataset, tracking, job, reached) as run:
        profile = profile_for(run.cluster, dataset, train, [train], run.catalog, run.job)
        outcome = train_task(train.faults)(
            label,
            run.cluster,
            dataset,
            run.job.resolved(train),
            profile,
            tracking,
            catalog=run.catalog,
            epoch_samples=run.epoch_samples,
            data=run.data,
            job=run.job,
        )
    return {"run_id": outcome.run_id, "metrics": outcome.metrics.flat()}
