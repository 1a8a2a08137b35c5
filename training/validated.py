"""A job validated once: the one value a command and its flow take, checked nowhere else.

`validated_job(cluster, configs)` runs every check a job can have before its data is read, in
the order of their cost: the rules across models (`check_job`) for each training config the
job runs, without torch; then the recipe imported and its learning-rate rule resolved; then
each worker's device, precision and cores on this host. It returns a `ValidatedJob`.

A command calls it before its flow starts; the flow calls it at its entry with the same models
and, in the same process, gets the same value back: nothing is checked twice. A flow run
started elsewhere (a deployment, the Prefect UI) finds none and runs the checks once, at its
entry. A job that fails a check is not remembered: it fails again the same way.
`ValidatedJob.check_data`: the recipe reads what a dataset holds, once per kind of data.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from hetflow.config import ClusterSpec, TrainConfig, check_job

if TYPE_CHECKING:
    from hetflow.training.recipes import DataInfo, Recipe

REMEMBERED = 32  # jobs remembered per process; a job past them is validated again
_jobs: OrderedDict[str, ValidatedJob] = OrderedDict()
_lock = threading.Lock()


@dataclass
class ValidatedJob:
    """A cluster and the training configs it runs, every check passed on this host. `recipe`
    is the configs' recipe (they share it); `data_checked`, what kinds of data it was checked
    against (`check_data`)."""

    cluster: ClusterSpec
    configs: tuple[TrainConfig, ...]
    recipe: Recipe
    data_checked: set[DataInfo] = field(default_factory=set)

    def check_data(self, manifest) -> None:
        """A one-line ConfigError naming `train.recipe` unless the recipe reads what the
        dataset of `manifest` holds (`recipes.check_fits`); each kind of data checked once."""
        from hetflow.training.recipes import DataInfo, check_fits

        info = DataInfo.from_manifest(manifest)
        if info in self.data_checked:
            return
        check_fits(self.recipe, info, getattr(manifest, "url", "the dataset"))
        self.data_checked.add(info)


def _key(cluster: ClusterSpec, configs: Sequence[TrainConfig]) -> str:
    return "\n".join(m.model_dump_json() for m in (cluster, *configs))


def validated_job(cluster: ClusterSpec, configs: Sequence[TrainConfig]) -> ValidatedJob:
    """The job of `cluster` running each of `configs` (one, or a comparison's variants),
    validated (see the module), or the value this process made for the same models before.
    Raises the first check's one-line ConfigError."""
    key = _key(cluster, configs)
    with _lock:
        if key in _jobs:
            _jobs.move_to_end(key)
            return _jobs[key]
    job = _validate(cluster, tuple(configs))
    with _lock:
        _jobs[key] = job
        while len(_jobs) > REMEMBERED:
            _jobs.popitem(last=False)
    return job


# What a job's configs may differ in: the variants of a comparison (`TrainConfig.compared`),
# whose diloco baseline is the synchronous run (another strategy, its rounds' options unset).
VARIANT_KNOBS = {"schedule", "compression", "strategy", "diloco"}


def _validate(cluster: ClusterSpec, configs: tuple[TrainConfig, ...]) -> ValidatedJob:
    """Every check, the cheap ones first. The configs differ in `VARIANT_KNOBS` at most (a
    ValueError otherwise), so the recipe and the devices are checked against the first."""
    if len({c.model_dump_json(exclude=VARIANT_KNOBS) for c in configs}) != 1:
        raise ValueError(
            "validated_job: one or more configs that differ in a comparison's variant knobs at most"
        )
    for train in configs:
        check_job(cluster, train)
    from hetflow.training.cores import core_sets, host_cores
    from hetflow.training.devices import check_devices
    from hetflow.training.loop.optim import resolve_optimizer
    from hetflow.training.recipes import check_recipe

    recipe = check_recipe(configs[0])
    for train in configs[1:]:
        resolve_optimizer(train, recipe)
    check_devices(cluster, configs[0])
    core_sets(cluster, host_cores())
    return ValidatedJob(cluster, configs, recipe)
