"""What a run plans its first step from when it measures nothing before it (pure).

The optimized run starts training at once and learns each worker's step-time curve from its
own steps (`rebalancer.Rebalancer`); its first plan comes from the best prior it has:

1. the profile history, where every worker's type has a fresh entry (`assemble.from_entries`,
   by the task that looks the entries up: `tasks.history.prior_or_history`);
2. else published ratios, where every worker names a device preset (its published per-batch
   latencies, fitted as a line: `published_prior`) or an EC2 instance type (the catalog's peak
   FLOP/s: `infra.catalog.seed_profile`);
3. else the equal split (`equal_prior`): a worker's declared emulated `speed` is what the run
   must rediscover, not a prior.

Priors of different kinds do not share a unit of time, so a cluster takes the first kind that
covers every worker. A prior's profile has `prior` set: nothing in it was measured in this
cluster, its all-reduce is unknown (0) and its memory caps are the declared ones.
"""

from __future__ import annotations

from hetflow.config import ClusterSpec, TrainConfig
from hetflow.emulation.presets import PRESETS
from hetflow.perf.fitting import fit_affine
from hetflow.records import Profile, RankProfile

EQUAL = "prior: the equal split (nothing known)"
HISTORY = "the profile history"  # what `prior_kind` says of an entry of the history


def line_rank(i: int, a: float, c: float, ref: int, **fields) -> RankProfile:
    """Rank `i`'s `RankProfile` of a compute line a + c x batch, its step and pace at the
    reference batch `ref`; `fields`: any other of its fields (the worker's name, the batches
    the line was fitted through).

    >>> line_rank(0, 0.01, 0.001, 10).samples_per_s
    500.0
    """
    step = a + c * ref
    return RankProfile(
        rank=i,
        samples_per_s=ref / step,
        step_compute_s=step,
        fit_latency_s=a,
        fit_s_per_sample=c,
        **fields,
    )


def _profile(
    cluster: ClusterSpec, train: TrainConfig, ranks: list[RankProfile], sources
) -> Profile:
    fastest = max(r.samples_per_s for r in ranks)
    for r in ranks:
        r.relative_speed = r.samples_per_s / fastest
    return Profile(
        cluster=cluster.name, model=train.recipe, ranks=ranks, sources=list(sources), prior=True
    )


def equal_prior(cluster: ClusterSpec, train: TrainConfig) -> Profile:
    """Every worker alike (a proportional line of 1 ms a sample): the equal split.

    >>> p = equal_prior(ClusterSpec.from_speeds([1, 4]), TrainConfig())
    >>> [r.fit_s_per_sample for r in p.ranks], p.sources[0], p.prior
    ([0.001, 0.001], 'prior: the equal split (nothing known)', True)
    """
    ref = max(1, train.global_batch // cluster.world_size)
    ranks = [line_rank(i, 0.0, 1e-3, ref, worker=w.name) for i, w in enumerate(cluster.workers)]
    return _profile(cluster, train, ranks, [EQUAL] * cluster.world_size)


def published_prior(cluster: ClusterSpec, train: TrainConfig) -> Profile | None:
    """Where every worker names a device preset: each one's published latencies (ms per batch,
    `emulation.presets`) fitted as a line in seconds; None otherwise.

    >>> p = published_prior(ClusterSpec.from_speeds(["t4", "a100"]), TrainConfig())
    >>> p.sources[0], p.ranks[0].fit_s_per_sample > p.ranks[1].fit_s_per_sample
    ('prior: the published curve of preset t4', True)
    >>> published_prior(ClusterSpec.from_speeds([1, 2]), TrainConfig()) is None
    True
    """
    if not all(w.preset for w in cluster.workers):
        return None
    ref = max(1, train.global_batch // cluster.world_size)
    ranks, sources = [], []
    for i, w in enumerate(cluster.workers):
        table = PRESETS[w.preset].latency_ms
        a, c = fit_affine(list(table), [ms / 1e3 for ms in table.values()])
        ranks.append(line_rank(i, max(a, 0.0), max(c, 1e-9), ref, worker=w.name))
        sources.append(f"prior: the published curve of preset {w.preset}")
    return _profile(cluster, train, ranks, sources)


def prior_kind(source: str) -> str:
    """What a prior's source says it is, without the entry it names.

    >>> prior_kind("prior: the profile history, s3://b/profiles/types/x/1.json (2.0 h old)")
    'the profile history'
    >>> prior_kind(EQUAL)
    'the equal split (nothing known)'
    """
    return source.removeprefix("prior: ").split(", ")[0]


def mark_prior(profile: Profile, sources: list[str]) -> Profile:
    """`profile` (from the history or a catalog's seed) as a prior: `prior` set, each worker's
    source what `sources` says."""
    return profile.model_copy(update={"prior": True, "sources": list(sources)})
