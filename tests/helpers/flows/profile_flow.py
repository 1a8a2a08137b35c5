"""Helpers both halves of test_profile_flow.py use: tests/unit/flows/test_profile_flow.py and
tests/integration/flows/test_profile_flow.py (and any other test module that imports them)."""

from __future__ import annotations

from hetflow.records import Profile

from tests.profiles import profile_of, rank_profile


def speeds(relative: dict[str, float], created_at: str | None = None) -> Profile:
    """A profile whose workers have these relative speeds."""
    ranks = [
        rank_profile(i, 100 * v, worker=name, relative_speed=v)
        for i, (name, v) in enumerate(relative.items())
    ]
    return profile_of(ranks, created_at=created_at)
