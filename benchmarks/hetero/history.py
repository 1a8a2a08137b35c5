"""`static@history`: the static plan a user's second run makes, from the profile history.

A first run profiles the cluster and stores one history entry per worker type (the first
worker of each: `training.plan.assemble.entries_of`); a second run on the same types finds every one
fresh and launches no profile, assembling its profile from the entries (`tasks.history.
profile_or_reuse`, through `training.plan.assemble`: compute at this cluster's reference batch
from each entry's fit, the all-reduce from the ring model). `history_profile` does the same
with this invocation's profile standing in for the history, with no S3 in between; the
variant is charged no profile (`profile_charged_s`): the run that measured it paid for it.
"""

from __future__ import annotations

from hetflow.config import ClusterSpec, TrainConfig
from hetflow.history import type_key
from hetflow.records import Profile
from hetflow.training.metrics import needs_profile
from hetflow.training.plan.assemble import entries_of, from_entries

HISTORY = "history"  # the variant tag: VARIANT@history
FROM_HISTORY = "the profile history (this invocation's profile, stored as its type's entry)"


def history_profile(profile: Profile, cluster: ClusterSpec, train: TrainConfig) -> Profile:
    """The profile a second run of `train` on `cluster` assembles once `profile` is in the
    history (pure): each worker gets the entry of its type (`history.type_key`), which is the
    first worker of that type as `profile` measured it, and nothing was measured in the run
    (`profiling_time_s` 0)."""
    keys = [type_key(cluster, i, train) for i in range(cluster.world_size)]
    entries = {e.key: e for e in entries_of(profile, cluster, keys, "history")}
    chosen = [entries[k] for k in keys]
    sources = [f"{FROM_HISTORY}: {e.rank.worker}" for e in chosen]
    return from_entries(cluster, train, chosen, sources)


def profile_charged_s(name: str, cfg: TrainConfig, profile: Profile) -> float:
    """The profile time variant `name`'s end-to-end figures pay: the invocation's profile where
    it plans from one measured before its first step (`needs_profile`: static,
    dynamic@profile); none where it plans from the history (@history: an earlier run paid) or
    from a prior (baseline, dynamic)."""
    if HISTORY in name.split("@")[1:] or not needs_profile(cfg):
        return 0.0
    return profile.profiling_time_s
