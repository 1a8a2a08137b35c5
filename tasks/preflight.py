"""What every flow checks first: its job is valid here (`validated_job`, once per process:
the command that started the flow made it already) and the services the run will use answer,
or it fails in one line.

No retries: a dead endpoint is named at once (`hetflow.infra.preflight`), before any dataset is
written or any worker launched; the tasks after it keep their own retries for transient faults.
"""

from __future__ import annotations

from prefect import task

from hetflow.config import DatasetSpec, TrackingConfig
from hetflow.infra.preflight import check_services
from hetflow.training.validated import ValidatedJob, validated_job

__all__ = ["ValidatedJob", "reach_services", "validated_job"]


@task(task_run_name="check services", retries=0)
def reach_services(dataset: DatasetSpec, tracking: TrackingConfig | None = None) -> None:
    """S3 for `dataset` and MLflow for `tracking` (when given) answer; else ServiceUnreachable,
    one line naming each dead endpoint and the variable to set. The Prefect API answers: this
    runs in a flow run. Services the command asked a moment ago are not asked again
    (`check_services`)."""
    check_services(dataset.url, tracking)
