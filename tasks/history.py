"""The profile history's tasks: look a cluster's worker types up, measure only what is unknown,
store what was measured, read what `hetflow recommend` may use.

Thin: where the entries live and which are fresh is `hetflow.history.store`; the entries a
profile or a run's steps give and the profile assembled from entries are the plan's
(`training.plan.assemble`, `training.plan.learned`); the measured curves `recommend` reads are
the forecast's (`forecast.rent.rental.measured_history`). Here: the Prefect tasks (retries,
run names), the launch of a profile, and the lines a run's log shows.
"""

from __future__ import annotations

from prefect import task

from hetflow.config import ClusterSpec, DatasetSpec, TrainConfig
from hetflow.forecast.rent.rental import History, measured_history
from hetflow.history import MEASURED_NOW, TypeEntry, TypeKey, source_of, sources_of
from hetflow.history.store import (
    cluster_keys,
    fresh_entries,
    newest_real,
    types_prefix,
    write_entries,
)
from hetflow.infra.catalog import Catalog, seed_profile
from hetflow.infra.paths import new_run_dir
from hetflow.infra.s3 import local_s3_endpoint
from hetflow.records import Profile, RunResult
from hetflow.tasks.profile import profile_stamp
from hetflow.training.job import ResolvedJob
from hetflow.training.launch.run import measure_profile
from hetflow.training.launch.spec import default_profile_batches
from hetflow.training.metrics import needs_profile
from hetflow.training.plan.assemble import entries_of, from_entries, sub_cluster, to_measure
from hetflow.training.plan.learned import learned_entries
from hetflow.training.plan.prior import (
    HISTORY,
    equal_prior,
    mark_prior,
    prior_kind,
    published_prior,
)


@task(retries=2, retry_delay_seconds=[1, 5], task_run_name="store {prefix} entries")
def store_entries(entries: list[TypeEntry], prefix: str) -> list[TypeEntry]:
    """`hetflow.history.store.write_entries`, retried: each entry stored, with `stored_at`."""
    return write_entries(entries, prefix)


def store_profile_entries(
    profile: Profile, cluster: ClusterSpec, dataset: DatasetSpec, train: TrainConfig
) -> list[TypeEntry]:
    """The entries of a profile of the whole `cluster` (one per worker type:
    `training.plan.assemble.entries_of`), measured at its `created_at`, stored in the
    dataset's history (`store_entries`)."""
    entries = entries_of(profile, cluster, cluster_keys(cluster, train), profile.created_at)
    return store_entries(entries, types_prefix(dataset))


@task(retries=2, retry_delay_seconds=[1, 5], task_run_name="look up {prefix}")
def lookup(prefix: str, keys: list[TypeKey], max_age_h: float) -> dict[TypeKey, TypeEntry]:
    """`hetflow.history.store.fresh_entries`, retried: the fresh entry of each distinct key."""
    return fresh_entries(prefix, keys, max_age_h)


def known_types(
    cluster: ClusterSpec, dataset: DatasetSpec, train: TrainConfig
) -> tuple[list[TypeKey], dict[TypeKey, TypeEntry]]:
    """Each worker's key (in cluster order), and the fresh history entry of each distinct key
    that has one (`lookup`; none where `train.profile_max_age_h` is 0)."""
    keys = cluster_keys(cluster, train)
    if not train.profile_max_age_h:
        return keys, {}
    return keys, lookup(types_prefix(dataset), keys, train.profile_max_age_h)


@task(task_run_name="profile {cluster.name} or reuse its types' history")
def profile_or_reuse(
    cluster: ClusterSpec, dataset: DatasetSpec, train: TrainConfig, job: ResolvedJob | None = None
) -> Profile:
    """The cluster's profile, measuring one worker per type without an entry at most
    `train.profile_max_age_h` old, and storing the entries of what it measured. Nothing
    unknown: no launch, `profiling_time_s` 0; some: one worker of each unknown type, then the
    profile assembled (`training.plan.assemble`: the all-reduce from the ring model). No entry
    at all (or `profile_max_age_h` 0): the whole cluster, as `profile_workers`, all-reduce
    measured; its workers run in parallel, so one per type would save little time. `job`: the
    flow's resolved job, whose placement a profile of the whole cluster takes as it is."""
    keys, known = known_types(cluster, dataset, train)
    prefix = types_prefix(dataset)
    measure = to_measure(keys, set(known))
    profiled = 0.0
    if not known:
        placement = job.placement_of(cluster) if job else None
        run_dir = new_run_dir("profile")
        profile = measure_profile(cluster, dataset, train, run_dir, placement=placement)
        profile.sources = [MEASURED_NOW] * cluster.world_size
        store_entries(entries_of(profile, cluster, keys, profile_stamp()), prefix)
        _print_sources(profile, measured=cluster.world_size)
        return profile
    if measure:
        part = sub_cluster(cluster, measure)
        batches = default_profile_batches(train.global_batch, cluster.world_size)
        measured = measure_profile(part, dataset, train, new_run_dir("profile"), batches)
        profiled = measured.profiling_time_s
        part_keys = [keys[i] for i in measure]
        new = entries_of(measured, part, part_keys, profile_stamp())
        known.update({e.key: e for e in store_entries(new, prefix)})
    sources = sources_of(keys, measure, known, [w.name for w in cluster.workers])
    profile = from_entries(cluster, train, [known[k] for k in keys], sources, profiled)
    _print_sources(profile, measured=len(measure))
    return profile


@task(task_run_name="prior of {cluster.name}: its types' history, published ratios or equal")
def prior_or_history(
    cluster: ClusterSpec,
    dataset: DatasetSpec,
    train: TrainConfig,
    catalog: Catalog | None = None,
    published: bool = True,
) -> Profile:
    """The prior a run that learns from its own steps plans its first step from, nothing
    launched (`training.plan.prior`): the profile history where every worker's type has an
    entry at most `train.profile_max_age_h` old (assembled as `profile_or_reuse` does); else
    the published ratios of every worker's preset (unless not `published`), or of every
    worker's instance type (the `catalog`'s peak FLOP/s); else the equal split. One line per
    worker says which."""
    keys, known = known_types(cluster, dataset, train)
    if all(k in known for k in keys):
        entries = [known[k] for k in keys]
        sources = [f"prior: {HISTORY}, {source_of(e)}" for e in entries]
        profile = mark_prior(from_entries(cluster, train, entries, sources), sources)
    elif published and (from_presets := published_prior(cluster, train)) is not None:
        profile = from_presets
    elif catalog is not None and catalog.types and all(w.instance_type for w in cluster.workers):
        seed = seed_profile(cluster, catalog)
        what = [f"prior: the catalog's peak FLOP/s of {w.instance_type}" for w in cluster.workers]
        profile = mark_prior(seed.model_copy(update={"model": train.recipe}), what)
    else:
        profile = equal_prior(cluster, train)
    for r, source in zip(profile.ranks, profile.sources, strict=True):
        print(f"plan of {r.worker} at step 0: {source}; learned from the training steps")
    return profile


def profile_for(
    cluster: ClusterSpec,
    dataset: DatasetSpec,
    train: TrainConfig,
    variants: list[TrainConfig],
    catalog: Catalog | None = None,
    job: ResolvedJob | None = None,
) -> Profile:
    """What `variants` plan from: the profile (`profile_or_reuse`, given the flow's `job`)
    where any of them needs one measured before its first step (`metrics.needs_profile`), else
    a prior, nothing launched (`prior_or_history`)."""
    if any(needs_profile(v) for v in variants):
        return profile_or_reuse(cluster, dataset, train, job)
    return prior_or_history(cluster, dataset, train, catalog)


def prior_note(profile: Profile) -> list[str]:
    """The comparison's note where the plan started from a prior (`Profile.prior`): nothing
    was profiled before the first step, and what step 0 was planned from."""
    if not profile.prior:
        return []
    kinds = sorted({prior_kind(src) for src in profile.sources})
    what = " and ".join([", ".join(kinds[:-1]), kinds[-1]] if len(kinds) > 1 else kinds)
    return [
        "the optimized run profiled nothing before its first step: it planned step 0 from "
        f"{what}, and re-planned from its own steps"
    ]


def store_learned(
    cluster: ClusterSpec, dataset: DatasetSpec, train: TrainConfig, result: RunResult
) -> list[TypeEntry]:
    """The entries of what the run's steps measured (`training.plan.learned.learned_entries`),
    stored in the history as a profile's are, so that the next run plans from them."""
    entries = learned_entries(cluster, train, result, profile_stamp())
    return store_entries(entries, types_prefix(dataset)) if entries else []


def _print_sources(profile: Profile, measured: int) -> None:
    """One line per worker: measured now, or the entry reused and its age."""
    for r, source in zip(profile.ranks, profile.sources, strict=True):
        print(f"profile of {r.worker}: {source}")
    how = (
        "all-reduce measured"
        if measured == len(profile.ranks)
        else "all-reduce from the ring model over the workers' links"
    )
    print(
        f"profiled {measured} of {len(profile.ranks)} workers in "
        f"{profile.profiling_time_s:.1f}s ({how}); relative speeds "
        + ", ".join(f"{r.worker}={r.relative_speed:.2f}" for r in profile.ranks)
    )


def read_type_history(
    url: str, instance_types: list[str], recipe: str, max_age_h: float
) -> History:
    """What `hetflow recommend` reads of the history under `url` (`newest_real`, made curves
    by `measured_history`), on the S3 the history lives in, as a run finds it
    (`local_s3_endpoint`): `AWS_ENDPOINT_URL` where set, AWS for a bucket of the user's own
    with credentials, else the local store's endpoint (the default bucket, where profile,
    train and the demo wrote)."""
    with local_s3_endpoint(url):
        return measured_history(url, max_age_h, newest_real(url, instance_types, recipe))


def request_history(request) -> History | None:
    """The history a `RecommendRequest` names (`history.url`), read for its candidates and its
    recipe at most `history.max_age_h` hours old; None where it names none."""
    h = request.history
    if not h.url:
        return None
    return read_type_history(h.url.rstrip("/"), request.names, request.job.recipe, h.max_age_h)
