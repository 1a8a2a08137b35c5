"""Measured-looking profiles for the tests that plan, report or compare from one."""

from __future__ import annotations

from hetflow.records import Profile, RankProfile


def rank_profile(rank: int, samples_per_s: float, **figures) -> RankProfile:
    """A rank whose step takes 1 / samples_per_s per sample and no latency unless `figures`
    say otherwise; every other figure as given or the record's default."""
    pace = 1.0 / samples_per_s
    base = {"fit_latency_s": 0.0, "fit_s_per_sample": pace, "step_compute_s": pace}
    return RankProfile(rank=rank, samples_per_s=samples_per_s, **{**base, **figures})


def profile_of(
    ranks: list[RankProfile], cluster: str = "test", model: str = "cnn", **fields
) -> Profile:
    return Profile(cluster=cluster, model=model, ranks=ranks, **fields)
