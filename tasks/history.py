"""The profile history per worker type in S3, and a profile that measures only what it lacks.

Entries (`hetflow.history.TypeEntry`) live next to the cluster profiles, in the dataset's
bucket: `s3://<bucket>/profiles/types/<key slug>/<UTC timestamp>.json`; for a dataset outside
S3, in the default bucket of the local store (`infra.s3.profiles_root`). Every profile run
writes one entry per type it measured (`store_entries`); `profile_or_reuse` (train, compare,
the demo) looks each worker's key up first and launches a profile of one worker per type
without a fresh entry, or none at all.
"""

from __future__ import annotations

from collections.abc import Iterator

from prefect import task

from hetflow.config import ClusterSpec, DatasetSpec, TrainConfig
from hetflow.forecast.rent.measured import curve_of
from hetflow.forecast.rent.rental import History
from hetflow.history import MEASURED_NOW, TypeEntry, TypeKey, kind_slug, type_key, versions
from hetflow.infra.catalog import Catalog, seed_profile
from hetflow.infra.paths import new_run_dir
from hetflow.infra.s3 import ensure_bucket, filesystem, local_s3_endpoint, profiles_root
from hetflow.records import Profile, RunResult
from hetflow.tasks.profile import profile_stamp
from hetflow.training.launch.run import measure_profile
from hetflow.training.launch.spec import default_profile_batches
from hetflow.training.metrics import needs_profile
from hetflow.training.plan.assemble import assemble, declared_link, sub_cluster, to_measure
from hetflow.training.plan.learned import LEARNED_FROM, compute_points, learned_rank
from hetflow.training.plan.prior import equal_prior, mark_prior, prior_kind, published_prior


def types_prefix(dataset: DatasetSpec) -> str:
    """`<profiles_root>/types`: the history of every worker type; for a dataset outside S3,
    the default bucket's, in the local store (`infra.s3.profiles_root`)."""
    return f"{profiles_root(dataset.url)}/types"


def entries_of(
    profile: Profile, cluster: ClusterSpec, keys: list[TypeKey], stamp: str
) -> list[TypeEntry]:
    """One entry per distinct key of `profile`'s ranks (the first worker of each; `keys` in
    rank order). A profile of one rank measured no link: the worker's declared one is kept."""
    entries: dict[TypeKey, TypeEntry] = {}
    for i, (r, key) in enumerate(zip(profile.ranks, keys, strict=True)):
        if key in entries:
            continue
        rank, source = r, "measured"
        if cluster.world_size < 2:
            gbps, latency, source = declared_link(cluster, i)
            rank = r.model_copy(update={"link_gbps": gbps, "link_latency_s": latency})
        entries[key] = TypeEntry(
            key=key,
            rank=rank,
            measured_at=stamp,
            link_source=source,
            cluster=profile.cluster,
            world_size=cluster.world_size,
            host_ranks=sum(o.node == r.node for o in profile.ranks),
        )
    return list(entries.values())


@task(retries=2, retry_delay_seconds=[1, 5], task_run_name="store {prefix} entries")
def store_entries(entries: list[TypeEntry], prefix: str) -> list[TypeEntry]:
    """Write each entry as `<prefix>/<slug>/<measured_at>.json`; returns them with `stored_at`."""
    ensure_bucket(prefix)
    fs, root = filesystem(prefix)
    out = []
    for e in entries:
        name = f"{e.key.slug()}/{e.measured_at}.json"
        fs.pipe_file(f"{root}/{name}", e.model_dump_json(indent=1).encode())
        out.append(e.model_copy(update={"stored_at": f"{prefix}/{name}"}))
    return out


def entries_newest_first(fs, folder: str, scheme: str) -> Iterator[TypeEntry]:
    """The entries of one key's `folder` that read as one, newest first, each with its URL
    as `stored_at` (an unreadable file is skipped)."""
    try:
        names = sorted(p for p in fs.ls(folder, detail=False) if p.endswith(".json"))
    except FileNotFoundError:
        return
    for path in reversed(names):
        try:
            entry = TypeEntry.model_validate_json(fs.cat_file(path))
        except (OSError, ValueError):  # pydantic's ValidationError is a ValueError
            continue
        yield entry.model_copy(update={"stored_at": f"{scheme}://{path}"})


def latest_entry(prefix: str, key: TypeKey, max_age_h: float) -> TypeEntry | None:
    """The newest readable entry under the key's folder whose key is `key` and which is at
    most `max_age_h` hours old; None when there is none."""
    fs, root = filesystem(prefix)
    entries = entries_newest_first(fs, f"{root}/{key.slug()}", prefix.split("://", 1)[0])
    return next((e for e in entries if e.key == key and e.age_h() <= max_age_h), None)


@task(retries=2, retry_delay_seconds=[1, 5], task_run_name="look up {prefix}")
def lookup(prefix: str, keys: list[TypeKey], max_age_h: float) -> dict[TypeKey, TypeEntry]:
    """The fresh entry of each distinct key that has one."""
    found = {}
    for key in dict.fromkeys(keys):
        entry = latest_entry(prefix, key, max_age_h)
        if entry is not None:
            found[key] = entry
    return found


def source_of(entry: TypeEntry) -> str:
    """'<entry URL> (<age> h old)'."""
    return f"{entry.stored_at} ({entry.age_h():.1f} h old)"


def known_types(
    cluster: ClusterSpec, dataset: DatasetSpec, train: TrainConfig
) -> tuple[list[TypeKey], dict[TypeKey, TypeEntry]]:
    """Each worker's key (in cluster order), and the fresh history entry of each distinct key
    that has one (`lookup`; none where `train.profile_max_age_h` is 0)."""
    keys = [type_key(cluster, i, train) for i in range(cluster.world_size)]
    if not train.profile_max_age_h:
        return keys, {}
    return keys, lookup(types_prefix(dataset), keys, train.profile_max_age_h)


@task(task_run_name="profile {cluster.name} or reuse its types' history")
def profile_or_reuse(cluster: ClusterSpec, dataset: DatasetSpec, train: TrainConfig) -> Profile:
    """The cluster's profile, measuring one worker per type without an entry at most
    `train.profile_max_age_h` old, and storing the entries of what it measured. Nothing
    unknown: no launch, `profiling_time_s` 0; some: one worker of each unknown type, then the
    profile assembled (`training.plan.assemble`: the all-reduce from the ring model). No entry
    at all (or `profile_max_age_h` 0): the whole cluster, as `profile_workers`, all-reduce
    measured; its workers run in parallel, so one per type would save little time."""
    keys, known = known_types(cluster, dataset, train)
    prefix = types_prefix(dataset)
    measure = to_measure(keys, set(known))
    profiled = 0.0
    if not known:
        profile = measure_profile(cluster, dataset, train, new_run_dir("profile"))
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
    entries = [known[k] for k in keys]
    ranks = [e.rank for e in entries]
    profile = assemble(cluster, train, ranks, sources, profiled, [e.host_ranks for e in entries])
    _print_sources(profile, measured=len(measure))
    return profile


@task(task_run_name="prior of {cluster.name}: its types' history, published ratios or equal")
def prior_or_history(
    cluster: ClusterSpec, dataset: DatasetSpec, train: TrainConfig, catalog: Catalog | None = None
) -> Profile:
    """The prior a run that learns from its own steps plans its first step from, nothing
    launched (`training.plan.prior`): the profile history where every worker's type has an
    entry at most `train.profile_max_age_h` old (assembled as `profile_or_reuse` does); else
    the published ratios of every worker's preset, or of every worker's instance type (the
    `catalog`'s peak FLOP/s); else the equal split. One line per worker says which."""
    keys, known = known_types(cluster, dataset, train)
    if all(k in known for k in keys):
        entries = [known[k] for k in keys]
        sources = [f"prior: the profile history, {source_of(e)}" for e in entries]
        ranks = [e.rank for e in entries]
        profile = assemble(cluster, train, ranks, sources, 0.0, [e.host_ranks for e in entries])
        profile = mark_prior(profile, sources)
    elif (published := published_prior(cluster, train)) is not None:
        profile = published
    elif catalog is not None and catalog.types and all(w.instance_type for w in cluster.workers):
        seed = seed_profile(cluster, catalog)
        what = [f"prior: the catalog's peak FLOP/s of {w.instance_type}" for w in cluster.workers]
        profile = mark_prior(seed.model_copy(update={"model": train.recipe}), what)
    else:
        profile = equal_prior(cluster, train)
    for r, source in zip(profile.ranks, profile.sources, strict=True):
        print(f"plan of {r.worker} at step 0: {source}; learned from the training steps")
    return profile


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


def profile_for(
    cluster: ClusterSpec,
    dataset: DatasetSpec,
    train: TrainConfig,
    variants: list[TrainConfig],
    catalog: Catalog | None = None,
) -> Profile:
    """What `variants` plan from: the profile (`profile_or_reuse`) where any of them needs one
    measured before its first step (`metrics.needs_profile`), else a prior, nothing launched
    (`prior_or_history`)."""
    if any(needs_profile(v) for v in variants):
        return profile_or_reuse(cluster, dataset, train)
    return prior_or_history(cluster, dataset, train, catalog)


def store_learned(
    cluster: ClusterSpec, dataset: DatasetSpec, train: TrainConfig, result: RunResult
) -> list[TypeEntry]:
    """One entry per worker type of `cluster` (the workers `result`'s ranks ran on, in order)
    from what the run's steps measured (`training.plan.learned`), stored in the history as a
    profile's entries are, so that the next run plans from them. A worker that never computed
    has none; the link is the declared one, the gradient's bytes its fp32 parameters'."""
    ref = max(1, train.global_batch // cluster.world_size)
    nodes = [r.node for r in result.ranks]
    entries: dict[TypeKey, TypeEntry] = {}
    stamp = profile_stamp()
    for i, r in enumerate(result.ranks):
        key = type_key(cluster, i, train)
        learned = learned_rank(i, compute_points(result, r.rank), ref)
        if key in entries or learned is None:
            continue
        gbps, latency, source = declared_link(cluster, i)
        rank = learned.model_copy(
            update={
                "worker": cluster.workers[i].name,
                "node": r.node,
                "device": cluster.workers[i].device,
                "link_gbps": gbps,
                "link_latency_s": latency,
                "grad_bytes": 4 * r.params,
            }
        )
        entries[key] = TypeEntry(
            key=key,
            rank=rank,
            measured_at=stamp,
            link_source=f"{source}; {LEARNED_FROM}",
            cluster=cluster.name,
            world_size=cluster.world_size,
            host_ranks=nodes.count(r.node),
        )
    return store_entries(list(entries.values()), types_prefix(dataset)) if entries else []


def sources_of(
    keys: list[TypeKey], measure: list[int], known: dict[TypeKey, TypeEntry], names: list[str]
) -> list[str]:
    """Per worker: 'measured now', 'measured now (as <the worker of its type measured>)', or
    the entry reused (`source_of`)."""
    first = {keys[i]: names[i] for i in measure}
    return [
        MEASURED_NOW
        if i in measure
        else f"{MEASURED_NOW} (as {first[k]})"
        if k in first
        else source_of(known[k])
        for i, k in enumerate(keys)
    ]


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
    """`type_history` on the S3 the history lives in, as a run finds it (`local_s3_endpoint`):
    `AWS_ENDPOINT_URL` where set, AWS for a bucket of the user's own with credentials, else
    the local store's endpoint (the default bucket, where profile, train and the demo wrote)."""
    with local_s3_endpoint(url):
        return type_history(url, instance_types, recipe, max_age_h)


def request_history(request) -> History | None:
    """The history a `RecommendRequest` names (`history.url`), read for its candidates and its
    recipe at most `history.max_age_h` hours old; None where it names none."""
    h = request.history
    if not h.url:
        return None
    return read_type_history(h.url.rstrip("/"), request.names, request.job.recipe, h.max_age_h)


def type_history(url: str, instance_types: list[str], recipe: str, max_age_h: float) -> History:
    """What `hetflow recommend` reads of the history under `url` (a types prefix, e.g.
    `s3://<bucket>/profiles/types`): per instance type, the newest entry measured on that type
    without emulation (a real device), for `recipe`, by this torch and hetflow; its curve
    (`rent.measured.curve_of`) where it is at most `max_age_h` hours old, else a line saying
    how old. Entries of other recipes, versions or emulated workers are not read as curves."""
    fs, root = filesystem(url)
    try:
        folders = fs.ls(root, detail=False)
    except FileNotFoundError:
        folders = []
    newest: dict[str, TypeEntry] = {}
    software = versions()
    for name in instance_types:
        for folder in folders:
            if folder.rstrip("/").rsplit("/", 1)[-1][:-17] != kind_slug(name):
                continue
            entry = next(entries_newest_first(fs, folder, url.split("://", 1)[0]), None)
            if entry is not None and _stands_for(entry, name, recipe, software):
                if name not in newest or entry.measured_at > newest[name].measured_at:
                    newest[name] = entry
    curves, stale = {}, {}
    for name, entry in newest.items():
        if entry.age_h() > max_age_h:
            stale[name] = f"its newest entry is {entry.age_h():.1f} h old (> {max_age_h:g} h)"
        elif (curve := curve_of(entry.rank, source_of(entry))) is not None:
            curves[name] = curve
    return History(url, max_age_h, curves, stale)


def _stands_for(entry: TypeEntry, instance_type: str, recipe: str, software) -> bool:
    """Whether `entry` measured a real `instance_type` on `recipe` with `software`, the
    installed (torch, hetflow) versions."""
    key = entry.key
    same = key.kind == instance_type and key.recipe == recipe and key.emulation is None
    return same and (key.torch, key.hetflow) == software
