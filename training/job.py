"""One resolved job: the value a command builds once and passes down, checked nowhere else.

`resolve_job(cluster, configs)` runs every check a job can have before its data is read, in
the order of their cost: the rules across models (`check_job`) for each training config the
job runs, without torch; then the recipe imported (`recipe_of`) and its optimizer and
learning-rate rule resolved (`resolve_optimizer`, once: the configs differ in the knobs of a
comparison's variants at most, which the optimizer does not read); then each worker's device,
precision and cores on this host (`check_devices`, once; the rule of it that reads a variant's
compression for each config). It returns a frozen `ResolvedJob`, whose placement a launch of
the job's cluster takes as it is (`placement_of`, `launch.run.run_workers`).

Nothing is remembered between calls: a command resolves its job and hands the value to its
flow (the flows' `job` parameter); a flow run started elsewhere (a deployment, the Prefect UI)
is given none and resolves its own at its entry. The train task launches the job's configs as
they are (`RunSpec.train`: resolved), so neither it nor a rank resolves them again. A job
that fails a check raises its one-line ConfigError; calling again checks again.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from hetflow.config import ClusterSpec, TrainConfig, check_job

if TYPE_CHECKING:
    from hetflow.training.devices import Placement
    from hetflow.training.recipes import DataInfo, Recipe

# What a job's configs may differ in: the variants of a comparison (`TrainConfig.compared`),
# whose diloco baseline is the synchronous run (another strategy, its rounds' options unset).
VARIANT_KNOBS = {"schedule", "compression", "strategy", "diloco"}
# The fields `resolve_optimizer` fills: the same for every variant of a job.
OPTIMIZER_FIELDS = (
    "optimizer",
    "lr",
    "weight_decay",
    "lr_scaling",
    "lr_tuned_batch",
    "lr_warmup_steps",
)


@dataclass(frozen=True)
class ResolvedJob:
    """A cluster and the training configs it runs, every check passed on this host.

    `given`: the configs as the caller gave them (`matches` compares against them);
    `configs`: the same, resolved (the optimizer and its learning-rate rule concrete: what
    runs, what MLflow's params name); `recipe`: the recipe they share; `placement`: each
    worker's device and precision on this host and the process group's backend. Frozen; the
    one thing it keeps is `check_data`'s answer, per kind of data, for this value alone."""

    cluster: ClusterSpec
    given: tuple[TrainConfig, ...]
    configs: tuple[TrainConfig, ...]
    recipe: Recipe = field(compare=False)  # made of `configs`: equal configs, equal recipe
    placement: Placement
    data_checked: set[DataInfo] = field(default_factory=set, compare=False, repr=False)

    @classmethod
    def __get_pydantic_core_schema__(cls, source, handler):
        """As a flow's parameter (`job`), Prefect's validation takes the value as it is (an
        instance check): it is never rebuilt, nor checked again."""
        from pydantic_core import core_schema

        return core_schema.is_instance_schema(cls)

    def matches(self, cluster: ClusterSpec, configs: Sequence[TrainConfig]) -> bool:
        """Whether this is the job of `cluster` running `configs` (as given, in order)."""
        return self.cluster == cluster and self.given == tuple(configs)

    def resolved(self, given: TrainConfig) -> TrainConfig:
        """The resolved config of one of the configs given; a ValueError for any other."""
        for mine, resolved in zip(self.given, self.configs, strict=True):
            if mine == given:
                return resolved
        raise ValueError("ResolvedJob.resolved: a config this job was not resolved for")

    def placement_of(self, cluster: ClusterSpec) -> Placement | None:
        """The job's `placement` where `cluster` places as the job's cluster does (the same
        launcher, and the same workers' devices and precisions in the same order: all a
        placement reads of a cluster; `tasks.opening` may fill in the workers' instance types),
        so that a launch of it checks nothing again; None for another cluster (a sub-cluster,
        workers left out), whose ranks' local devices differ."""

        def placed(c: ClusterSpec) -> tuple:
            return c.launcher, [(w.device, w.precision) for w in c.workers]

        return self.placement if placed(cluster) == placed(self.cluster) else None

    def check_data(self, manifest) -> DataInfo:
        """What the dataset of `manifest` holds (`DataInfo`); a one-line ConfigError naming
        `train.recipe` unless the recipe reads it (`recipes.check_fits`), each kind of data
        checked once per job."""
        from hetflow.training.recipes import DataInfo, check_fits

        info = DataInfo.from_manifest(manifest)
        if info not in self.data_checked:
            check_fits(self.recipe, info, getattr(manifest, "url", "the dataset"))
            self.data_checked.add(info)
        return info


def resolve_job(cluster: ClusterSpec, configs: Sequence[TrainConfig]) -> ResolvedJob:
    """The job of `cluster` running each of `configs` (one, or a comparison's variants),
    checked and resolved (see the module). The configs differ in `VARIANT_KNOBS` at most (a
    ValueError otherwise). Raises the first check's one-line ConfigError."""
    given = tuple(configs)
    if len({c.model_dump_json(exclude=VARIANT_KNOBS) for c in given}) != 1:
        raise ValueError(
            "resolve_job: one or more configs that differ in a comparison's variant knobs at most"
        )
    for train in given:
        check_job(cluster, train)
    from hetflow.training.cores import core_sets, host_cores
    from hetflow.training.devices import check_devices, check_scaled_sync
    from hetflow.training.loop.optim import resolve_optimizer
    from hetflow.training.recipes import recipe_of

    recipe = recipe_of(given[0])
    first = resolve_optimizer(given[0], recipe)
    chosen = {k: getattr(first, k) for k in OPTIMIZER_FIELDS}
    resolved = tuple(c.model_copy(update=chosen) for c in given)
    placement = check_devices(cluster, given[0])
    if cluster.launcher != "ray":  # under Ray each rank's device is its node's: not known here
        for train in given[1:]:  # the rule that reads a variant's compression
            check_scaled_sync(cluster, placement, train)
    core_sets(cluster, host_cores())
    return ResolvedJob(cluster, given, resolved, recipe, placement)


def job_for(
    job: ResolvedJob | None, cluster: ClusterSpec, configs: Sequence[TrainConfig]
) -> ResolvedJob:
    """`job` where it is the job of `cluster` and `configs` (a command resolved it), else the
    job resolved here (a flow run with nothing before it). A job given for other models is a
    caller's mistake: a ValueError, not a second resolution."""
    if job is None:
        return resolve_job(cluster, configs)
    if not job.matches(cluster, configs):
        raise ValueError("job: resolved for another cluster or other training configs")
    return job
