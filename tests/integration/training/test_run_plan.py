"""One path from a plan to a result: the train task, `hetflow bench hetero` and the simulator's
calibration all launch through `run_plan`, so a worker the plan drops is launched by none of
them. The launcher itself is replaced by one that records the job it was handed and stops
there: what runs under torchrun is tested in test_drop_from_launch (a real run)."""

from __future__ import annotations

import pytest

from hetflow.config import TrackingConfig

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


def test_the_train_task_does_not_launch_a_dropped_worker(handed, digits):
    from hetflow.tasks.train import train_variant
    from hetflow.training.job import resolve_job

    job = resolve_job(CLUSTER, [TRAIN])
    with pytest.raises(Launched):
        train_variant.fn("static", CLUSTER, digits, TRAIN, _profile(), TrackingConfig(), job=job)
    (spec,) = handed
    _assert_w2_not_launched(spec)
    assert handed.placements == [None]  # the job's placement is of 3 workers: placed anew
