"""What every flow checks first: the services the run will use answer, and the job's recipe
and devices can be had, or it fails in one line.

No retries: a dead endpoint is named at once (`hetflow.infra.preflight`), before any dataset is
written or any worker launched; the tasks after it keep their own retries for transient faults.
"""

from __future__ import annotations

from prefect import task

from hetflow.config import ClusterSpec, DatasetSpec, TrackingConfig, TrainConfig
from hetflow.infra.data.format import Manifest
from hetflow.infra.preflight import check_services
from hetflow.training.cores import core_sets, host_cores
from hetflow.training.devices import check_devices
from hetflow.training.recipes import check_recipe


@task(task_run_name="check services", retries=0)
def reach_services(dataset: DatasetSpec, tracking: TrackingConfig | None = None) -> None:
    """S3 for `dataset` and MLflow for `tracking` (when given) answer; else ServiceUnreachable,
    one line naming each dead endpoint and the variable to set. The Prefect API answers: this
    runs in a flow run."""
    check_services(dataset.url, tracking)


def check_training(
    train: TrainConfig, cluster: ClusterSpec | None = None, manifest: Manifest | None = None
) -> None:
    """Before anything launches: the recipe `train` names imports, has what a Recipe needs and
    reads what `manifest` (if given) holds; every worker of `cluster` (if given) can have its
    device, precision and cores on this host. A one-line ConfigError naming the field otherwise
    (`train.recipe`; `device: cuda` where there is no CUDA, `bf16` on a GPU without it)."""
    check_recipe(train, manifest)
    if cluster is not None:
        check_devices(cluster, train)
        core_sets(cluster, host_cores())
