"""A cluster's profile put together from per-type history entries, and the entries a profile
gives (pure; `hetflow.history`, stored by `hetflow.history.store`).

Which workers a run must measure (`to_measure`: one per type without a fresh entry), the
cluster that measures them (`sub_cluster`: each keeps its emulated slowdown and link), the
entries a profile's ranks make (`entries_of`), and the `Profile` of the whole cluster from the
entries (`assemble`, `from_entries`). The compute, memory and device
figures are the entries' own; the all-reduce is not measured in this cluster: it is the ring
model (`hetflow.perf.collective.ring_allreduce_time`) over the entries' links, the slowest
hop setting the pace. Our own assembly: torch has no notion of a profile to reuse.
"""

from __future__ import annotations

from hetflow.config import ClusterSpec, TrainConfig
from hetflow.history import TypeEntry, TypeKey
from hetflow.perf.collective import (
    INTRA_NODE_GBPS,
    RING_ALPHA_S,
    RING_INTRA_ALPHA_S,
    ring_allreduce_time,
)
from hetflow.records import Profile, RankProfile


def to_measure(keys: list[TypeKey], known: set[TypeKey]) -> list[int]:
    """The first worker of each key not in `known`, in cluster order.

    >>> from hetflow.config import ClusterSpec, TrainConfig
    >>> from hetflow.history import type_key
    >>> c = ClusterSpec.from_speeds([1, 1, 2, 4])
    >>> keys = [type_key(c, i, TrainConfig(), host="h") for i in range(4)]
    >>> to_measure(keys, set()), to_measure(keys, {keys[0], keys[3]})
    ([0, 2, 3], [2])
    """
    seen: set[TypeKey] = set(known)
    out = []
    for i, key in enumerate(keys):
        if key not in seen:
            seen.add(key)
            out.append(i)
    return out


def sub_cluster(cluster: ClusterSpec, indices: list[int]) -> ClusterSpec:
    """The workers `indices` of `cluster` as a cluster of their own that emulates each as the
    whole cluster does: the time scale grows by the whole cluster's fastest speed over the
    part's (each worker's slowdown stays), and each link's bandwidth by as much and its latency
    down by as much (the `Link` charges them times the scale)."""
    workers = [cluster.workers[i] for i in indices]
    k = max(w.speed for w in cluster.workers) / max(w.speed for w in workers)
    if cluster.emulate and k != 1:
        workers = [
            w.model_copy(
                update={
                    "link_gbps": w.link_gbps * k if w.link_gbps else None,
                    "link_latency_ms": w.link_latency_ms / k,
                }
            )
            for w in workers
        ]
    scale = cluster.time_scale * k if cluster.emulate else cluster.time_scale
    return cluster.model_copy(
        update={"name": f"{cluster.name}-types", "workers": workers, "time_scale": scale}
    )


def declared_link(cluster: ClusterSpec, i: int) -> tuple[float, float, str]:
    """(Gbit/s, latency s, what it is) of worker i's link where none was measured (a profile of
    one rank): its `link_gbps` (set, or the catalog's), on the emulated clock when emulated,
    behind a hop's `RING_ALPHA_S`; with none set, loopback: shared memory inside one host
    (`INTRA_NODE_GBPS['CPU']`, `RING_INTRA_ALPHA_S`), an assumption."""
    w = cluster.workers[i]
    scale = cluster.time_scale if cluster.emulate else 1.0
    if w.link_gbps:
        latency = w.link_latency_ms / 1e3 * scale if w.link_latency_ms else RING_ALPHA_S
        return w.link_gbps / scale, latency, "declared"
    return INTRA_NODE_GBPS["CPU"], RING_INTRA_ALPHA_S, "assumed loopback"


def ring_figures(ranks: list[RankProfile]) -> dict:
    """The all-reduce figures of one ring over `ranks` from their links: latency 2(n-1) hops of
    the slowest hop's, bandwidth the narrowest link's, the gradient's time by the ring model."""
    n = len(ranks)
    if n < 2:
        return {"allreduce_latency_s": 0.0, "allreduce_gbps": None, "grad_allreduce_s": 0.0}
    alpha = max(r.link_latency_s or 0.0 for r in ranks)
    gbps = min(r.link_gbps or INTRA_NODE_GBPS["CPU"] for r in ranks)
    grad = max(r.grad_bytes for r in ranks)
    return {
        "allreduce_latency_s": ring_allreduce_time(0.0, n, alpha, gbps),  # its hops alone
        "allreduce_gbps": gbps,
        "grad_allreduce_s": ring_allreduce_time(grad, n, alpha, gbps),
    }


def host_share(r: RankProfile, then: int, now: int) -> dict:
    """A CPU rank's memory figures when `now` ranks share its host where `then` did: its
    share of the host's memory (`probes.memory`) scales by then / now, and its cap with it
    (the budget it was fitted in, cap x bytes per sample + fixed bytes, scaled; the fixed part
    stays). Nothing changes on a GPU (its cap is an out-of-memory search on its own device) or
    where the figures are missing.

    >>> r = RankProfile(rank=0, samples_per_s=1, step_compute_s=1, fit_latency_s=0,
    ...     fit_s_per_sample=1, device="cpu", memory_cap_batch=100, memory_per_sample_bytes=10,
    ...     memory_fixed_bytes=1000, memory_available_bytes=4000)
    >>> host_share(r, then=1, now=4)
    {'memory_available_bytes': 1000, 'memory_cap_batch': 0}
    >>> host_share(r, then=2, now=1)["memory_cap_batch"]
    300
    """
    per, fixed, cap = r.memory_per_sample_bytes, r.memory_fixed_bytes, r.memory_cap_batch
    if r.device != "cpu" or then == now or None in (per, fixed, cap, r.memory_available_bytes):
        return {}
    budget = (cap * per + fixed) * then / now
    return {
        "memory_available_bytes": int(r.memory_available_bytes * then / now),
        "memory_cap_batch": max(int((budget - fixed) // per), 0),
    }


def assemble(
    cluster: ClusterSpec,
    train: TrainConfig,
    ranks: list[RankProfile],
    sources: list[str],
    profiling_time_s: float = 0.0,
    host_ranks: list[int] | None = None,
) -> Profile:
    """The profile of `cluster` from one measured `RankProfile` per worker (in cluster order,
    each as its entry holds it, measured with `host_ranks` ranks on its host): renumbered and
    renamed, compute at this cluster's reference batch (global batch / workers) from each
    one's fit, memory by `host_share` (every worker on one host under the local launcher, one
    per node under Ray), speeds relative to the fastest, the all-reduce by `ring_figures`;
    `sources` says where each came from."""
    ref = max(1, train.global_batch // cluster.world_size)
    now = cluster.world_size if cluster.launcher == "local" else 1
    out = []
    for i, (w, r) in enumerate(zip(cluster.workers, ranks, strict=True)):
        step = max(r.fit_latency_s + r.fit_s_per_sample * ref, 1e-9)
        then = host_ranks[i] if host_ranks else now
        out.append(
            r.model_copy(
                update={
                    "rank": i,
                    "worker": w.name,
                    "step_compute_s": step,
                    "samples_per_s": ref / step,
                    "allreduce_bytes": [],
                    "allreduce_median_s": [],
                    **host_share(r, then, now),
                }
            )
        )
    fastest = max(r.samples_per_s for r in out)
    ring = ring_figures(out)
    out = [r.model_copy(update={"relative_speed": r.samples_per_s / fastest, **ring}) for r in out]
    return Profile(
        cluster=cluster.name,
        model=train.recipe,
        ranks=out,
        profiling_time_s=profiling_time_s,
        sources=list(sources),
    )


def from_entries(
    cluster: ClusterSpec,
    train: TrainConfig,
    entries: list[TypeEntry],
    sources: list[str],
    profiling_time_s: float = 0.0,
) -> Profile:
    """`assemble` of one entry per worker (in cluster order): each entry's rank, measured with
    its `host_ranks` ranks on its host."""
    ranks = [e.rank for e in entries]
    return assemble(
        cluster, train, ranks, sources, profiling_time_s, [e.host_ranks for e in entries]
    )


def entries_of(
    profile: Profile, cluster: ClusterSpec, keys: list[TypeKey], stamp: str
) -> list[TypeEntry]:
    """One entry per distinct key of `profile`'s ranks (the first worker of each; `keys` in
    rank order), measured at `stamp`. A profile of one rank measured no link: the worker's
    declared one is kept (`declared_link`)."""
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
