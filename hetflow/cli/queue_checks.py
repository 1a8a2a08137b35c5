"""What `hetflow queue submit` checks of a job before it queues it, beyond its flags' values
and its memory (`hetflow.cli.queue.checked_job`): whatever would fail the job in the session
that can be known now, refused in one line that names the flag.

Every check is one the train commands already run (`training.job.resolve_job`: the
rules across models, the recipe imported and its learning-rate rule, the worker's device and
cores; `infra.preflight.check_services`: the dataset's S3 answers; `cli.checks.check_dataset`:
a dataset already written holds a manifest and what the recipe reads; `recipes.check_fits`
for the data the session writes itself), on the worker of the queue's cluster with the most
memory, which the job fits: the job runs on one worker at the least. What only a run shows (a
recipe that raises at some step) is the session's to survive: the job fails alone.
"""

from __future__ import annotations

import re
from collections.abc import Mapping

from hetflow.config import ClusterSpec, ConfigError, DatasetSpec
from hetflow.config.queue import QueueJob, worker_memory_gb

# The dataset a session of `hetflow queue run` reads: the queue flow's default, which the
# session writes itself (scikit-learn's digits, in the S3 endpoint it starts or the one set).
QUEUE_DATASET = DatasetSpec()
# The kind and sizes of the data a session writes itself, known before it is written: the
# digits and the synthetic digits-shaped samples (64 features, 10 classes), `DataInfo`'s own
# defaults. Other sources are checked once ingested, in the session.
MADE_BY_THE_SESSION = ("digits", "synthetic")
# A field a check names that is the recipe's, though not the flag itself.
RECIPE_FIELDS = ("train.lr_scaling", "train.recipe_options")


def by_flag(e: Exception, flags: Mapping[str, str]) -> Exception:
    """`e` with its leading field (`train.recipe: ...`) renamed as the flag the user typed
    (`--recipe: ...`) where `flags` (field -> flag) has it; `e` itself otherwise."""
    message = str(e)
    m = re.match(r"^(train\.\w+): ", message)
    if not m:
        return e
    field = m.group(1)
    flag = "--recipe" if field in RECIPE_FIELDS else flags.get(field.removeprefix("train."))
    return type(e)(f"{flag}{message[len(field) :]}") if flag else e


def check_runnable(
    job: QueueJob,
    cluster: ClusterSpec,
    flags: Mapping[str, str],
    dataset: DatasetSpec = QUEUE_DATASET,
) -> None:
    """Refuse `job` in one line (the error of the first check that fails, naming the flag
    where `flags` has its field) unless it can run on `cluster`'s largest worker and read
    `dataset` (see the module). Imports the recipe, and with it torch."""
    from hetflow.cli.checks import check_dataset
    from hetflow.infra.preflight import check_services
    from hetflow.training.job import resolve_job
    from hetflow.training.plan.assemble import sub_cluster
    from hetflow.training.recipes import DataInfo, check_fits

    largest = max(range(cluster.world_size), key=lambda i: worker_memory_gb(cluster, i))
    try:
        checked = resolve_job(sub_cluster(cluster, [largest]), [job.train_config()])
        check_services(dataset_url=dataset.url)
        check_dataset(dataset, checked)
        if dataset.source in MADE_BY_THE_SESSION:
            check_fits(checked.recipe, DataInfo(), f"{dataset.url} ({dataset.source})")
    except ConfigError as e:
        raise by_flag(e, flags) from None


def check_launcher(cluster: ClusterSpec, launcher: str | None, address: str | None) -> ClusterSpec:
    """`cluster` under `hetflow queue run`'s `--launcher` and `--ray-address` (None: the
    cluster's own), refused in one line naming the flag before the session starts: an address
    without the Ray launcher; under Ray, no Ray cluster answering at the address, or a worker
    whose instance type no node of it carries (`cli.checks.check_ray_nodes`, which joins it,
    as the session would next)."""
    if address and (launcher or cluster.launcher) != "ray":
        raise ConfigError("--ray-address: needs --launcher ray (or launcher: ray in --cluster)")
    update = {"launcher": launcher or cluster.launcher}
    cluster = cluster.model_copy(update={**update, "ray_address": address or cluster.ray_address})
    if cluster.launcher != "ray":
        return cluster
    from hetflow.cli.checks import check_ray_nodes
    from hetflow.infra.preflight import ray_problem
    from hetflow.training.launch.ray_train import ray_address

    where = ray_address(cluster)
    problem = ray_problem(where)
    if problem is not None:
        flag = "--ray-address" if address else "cluster.ray_address"
        raise ConfigError(f"{flag}: {problem.replace(' (cluster.ray_address)', '')}")
    check_ray_nodes(cluster)
    return cluster
