"""One path from a plan to a result: the train task, `hetflow bench hetero` and the simulator's
calibration all launch through `run_plan`, so a worker the plan drops is launched by none of
them. The launcher itself is replaced by one that records the job it was handed and stops
there: what runs under torchrun is tested in test_drop_from_launch (a real run)."""

from __future__ import annotations

import pytest

from hetflow.config import DatasetSpec
from hetflow.records import Plan
from hetflow.training.launch import run as run_module
from hetflow.training.plan.planner import make_plan

from tests.helpers.training import run_plan as _shared
from tests.helpers.training.run_plan import (
    CLUSTER,
    TRAIN,
    Launched,
    _assert_w2_not_launched,
    _profile,
)

# the shared fixtures
handed = _shared.handed


def test_the_plan_drops_w2():
    assert make_plan(_profile(), CLUSTER, TRAIN).dropped == ["w2"]


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
