"""Helpers both halves of test_drop_from_launch.py use:
tests/unit/training/test_drop_from_launch.py and
tests/integration/training/test_drop_from_launch.py (and any other test module that imports
them)."""

from __future__ import annotations

from tests.profiles import profile_of, rank_profile

GPU_LATENCY, CPU_LATENCY = 0.004, 5.0  # a fast worker's fixed cost per step, a hopeless one's


def _profile(allreduce_s: float, latency_s: float = 0.0):
    """Two fast workers and one whose fixed cost is far beyond their step; the all-reduce of
    one gradient over all three takes `allreduce_s`, of which `latency_s` is its fixed part."""
    fig = {"grad_allreduce_s": allreduce_s, "allreduce_latency_s": latency_s}
    fast = [rank_profile(r, 20000.0, fit_latency_s=GPU_LATENCY, **fig) for r in range(2)]
    return profile_of([*fast, rank_profile(2, 200.0, fit_latency_s=CPU_LATENCY, **fig)])
