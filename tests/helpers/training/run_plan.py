"""Helpers both halves of test_run_plan.py use: tests/unit/training/test_run_plan.py and
tests/integration/training/test_run_plan.py (and any other test module that imports them)."""

from __future__ import annotations

import pytest

from hetflow.config import ClusterSpec, TrainConfig
from hetflow.training.launch import run as run_module
from hetflow.training.launch.spec import RunSpec

from tests.profiles import profile_of, rank_profile

CLUSTER = ClusterSpec.from_speeds([1, 1, 0.1], time_scale=2.0)


TRAIN = TrainConfig(recipe="digits-mlp", global_batch=48, steps=3, schedule="proportional")


class Launched(Exception):
    """Raised by the recording launcher once it holds the job."""


class Handed(list):
    """The jobs handed to the launcher, and the `placement` each was handed with."""

    placements: list


@pytest.fixture
def handed(monkeypatch) -> Handed:
    """The jobs handed to the launcher by `run_plan`, none of them run."""
    jobs = Handed()
    jobs.placements = []

    def record(spec: RunSpec, **kw):
        jobs.append(spec)
        jobs.placements.append(kw.get("placement"))
        raise Launched

    monkeypatch.setattr(run_module, "run_workers", record)
    return jobs


def _profile():
    """Two fast workers and w2, whose fixed cost is far beyond their step: a static plan
    drops it."""
    fast = [rank_profile(r, 20000.0, fit_latency_s=0.004, grad_allreduce_s=0.001) for r in (0, 1)]
    slow = rank_profile(2, 200.0, fit_latency_s=5.0, grad_allreduce_s=0.001)
    return profile_of([*fast, slow])


def _assert_w2_not_launched(spec: RunSpec) -> None:
    assert [w.name for w in spec.cluster.workers] == ["w0", "w1"]
    assert len(spec.plan.local_batches) == 2 and sum(spec.plan.local_batches) == 48
