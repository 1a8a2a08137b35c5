"""What every flow does first, in one place (`opened`): its job resolved (or taken from the
command that started it), the services it uses answering, its S3 endpoint, the instance types
its workers name, its dataset written or found, and the dataset read by the job's recipe.

No retries in the checks: a dead endpoint is named at once (`hetflow.infra.preflight`), before
any dataset is written or any worker launched; the tasks after them keep their own retries for
transient faults. Nothing is remembered across calls: what a command checked it passes down
(`job`, `reached`), and a flow run with no command before it checks everything once.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass

from prefect import task

from hetflow.config import ClusterSpec, DatasetSpec, TrackingConfig, TrainConfig
from hetflow.infra.catalog import Catalog
from hetflow.infra.preflight import Reached, check_services
from hetflow.infra.s3 import local_s3_endpoint
from hetflow.tasks.data import ingest_dataset
from hetflow.tasks.profile import resolve_instance_types
from hetflow.training.job import ResolvedJob, job_for
from hetflow.training.recipes import DataInfo

__all__ = ["Opened", "Reached", "ResolvedJob", "opened", "reach_services"]


@task(task_run_name="check services", retries=0)
def reach_services(
    dataset: DatasetSpec, tracking: TrackingConfig | None = None, reached: Reached | None = None
) -> Reached:
    """S3 for `dataset` and MLflow for `tracking` (when given) answer; else ServiceUnreachable,
    one line naming each dead endpoint and the variable to set. The Prefect API answers: this
    runs in a flow run. Those in `reached` (the command's answers) are not asked again."""
    return check_services(dataset.url, tracking, reached=reached)


@dataclass(frozen=True)
class Opened:
    """A flow's job, opened: `job` resolved, `cluster` with its workers' instance types
    filled in (`resolve_instance_types`) and their `catalog`, the dataset's kind of data
    (`data`, checked against the recipe) and its training split's samples."""

    job: ResolvedJob
    cluster: ClusterSpec
    catalog: Catalog
    data: DataInfo
    epoch_samples: int


@contextmanager
def opened(
    cluster: ClusterSpec,
    configs: Sequence[TrainConfig],
    dataset: DatasetSpec,
    tracking: TrackingConfig | None,
    job: ResolvedJob | None = None,
    reached: Reached | None = None,
) -> Iterator[Opened]:
    """The opening every flow shares, in the order of the cost of what it checks: the job of
    `cluster` and `configs` (`job` where the command resolved it, else resolved here:
    `training.job.job_for`); the services for `dataset` and `tracking` (None: no MLflow)
    answer (those in `reached` are not asked again); then, inside the run's S3 endpoint (held
    open until the `with` ends), the instance types, the dataset ingested (or found) and read
    by the recipe. Each raises its one-line error before anything is launched."""
    job = job_for(job, cluster, configs)
    reach_services(dataset, tracking, reached)  # before anything is written
    with local_s3_endpoint(dataset.url):
        cluster, catalog = resolve_instance_types(cluster)  # workers may name EC2 types
        manifest = ingest_dataset(dataset)
        data = job.check_data(manifest)
        yield Opened(job, cluster, catalog, data, manifest.splits["train"].samples)
