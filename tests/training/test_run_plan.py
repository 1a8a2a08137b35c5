"""One path from a plan to a result: the train task, `hetflow bench hetero` and the simulator's
calibration all launch through `run_plan`, so a worker the plan drops is launched by none of
them. The launcher itself is replaced by one that records the job it was handed and stops
there: what runs under torchrun is tested in test_drop_from_launch (a real run)."""

from __future__ import annotations

import pytest

from hetflow.config import ClusterSpec, DatasetSpec, TrackingConfig, TrainConfig
from hetflow.records import Plan
from hetflow.training.launch import run as run_module
from hetflow.training.launch.spec import RunSpec
from hetflow.training.plan.planner import make_plan

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


def test_the_plan_drops_w2():
    assert make_plan(_profile(), CLUSTER, TRAIN).dropped == ["w2"]


def test_the_train_task_does_not_launch_a_dropped_worker(handed, digits):
    from hetflow.tasks.train import train_variant
    from hetflow.training.job import resolve_job

    job = resolve_job(CLUSTER, [TRAIN])
    with pytest.raises(Launched):
        train_variant.fn("static", CLUSTER, digits, TRAIN, _profile(), TrackingConfig(), job=job)
    (spec,) = handed
    _assert_w2_not_launched(spec)
    assert handed.placements == [None]  # the job's placement is of 3 workers: placed anew


def test_the_hetero_bench_does_not_launch_a_dropped_worker(handed, tmp_path):
    from benchmarks.hetero import Bench, run_variant

    bench = Bench(CLUSTER, TRAIN, [(2, 1, 2.0), (1, 2, 3.0)], ["static"], 1)
    with pytest.raises(Launched):
        run_variant("static", 0, bench, _profile(), DatasetSpec(), str(tmp_path))
    (spec,) = handed
    _assert_w2_not_launched(spec)
    assert spec.stragglers == [(1, 2, 3.0)]  # w1's, at its launched rank; w2's went with it


def test_the_calibration_does_not_launch_a_dropped_worker(handed, tmp_path):
    from benchmarks.calibrate import _train

    plan = make_plan(_profile(), CLUSTER, TRAIN)
    with pytest.raises(Launched):
        _train("optimized", CLUSTER, TRAIN, plan, DatasetSpec(), str(tmp_path), _profile(), "x")
    (spec,) = handed
    _assert_w2_not_launched(spec)


def test_an_equal_plan_launches_every_worker(handed, tmp_path):
    from hetflow.training.devices import Placement

    plan = Plan.equal([16, 16, 16])
    placed = Placement(["cpu"] * 3, ["fp32"] * 3, "gloo")
    with pytest.raises(Launched):
        run_module.run_plan(
            CLUSTER, plan, TRAIN, DatasetSpec(), tmp_path / "r", variant="b", placement=placed
        )
    (spec,) = handed
    assert handed.placements == [placed]  # every worker launched: the caller's placement
    assert [w.name for w in spec.cluster.workers] == ["w0", "w1", "w2"]
    assert spec.cluster.time_scale == CLUSTER.time_scale and spec.run_name == "r"
