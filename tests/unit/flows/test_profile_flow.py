"""The profile flow: storage and history in S3, drift flags, MLflow and Prefect artifacts.

The torchrun profile itself is tested in test_probes.py; here `profile_workers` is replaced by
a stand-in that returns measured-looking figures, so that the flow's own work is what runs.
"""

from __future__ import annotations

import pytest

from hetflow.config import ClusterSpec
from hetflow.records import Profile
from hetflow.tasks.profile import speed_drift

from tests.helpers.flows.profile_flow import speeds
from tests.profiles import rank_profile

pytestmark = pytest.mark.timeout(240)


def test_speed_drift_flags_only_workers_that_moved_beyond_the_threshold():
    before = speeds({"a": 0.5, "b": 1.0}, created_at="t0")
    after = speeds({"a": 0.40, "b": 1.0, "c": 0.1})
    flagged = speed_drift(before, after, 0.15)
    assert [f.worker for f in flagged] == ["a"] and flagged[0].change == pytest.approx(-0.2)
    assert (flagged[0].previous_speed, flagged[0].speed, flagged[0].previous_profile) == (
        0.5,
        0.4,
        "t0",
    )
    assert speed_drift(None, after, 0.15) == [] and speed_drift(before, after, 0.25) == []


def test_profile_from_a_profile_run_names_workers_and_relative_speeds_in_rank_order():
    cluster = ClusterSpec.from_speeds([1, 2, 4])
    result = {
        "mode": "profile",
        "ranks": [  # as gathered, but ranks are matched by number
            rank_profile(2, 80.0, node="n").model_dump(mode="json"),
            rank_profile(0, 20.0, node="n").model_dump(mode="json"),
            rank_profile(1, 40.0, node="n").model_dump(mode="json"),
        ],
    }
    profile = Profile.from_result(result, cluster, "mlp", profiling_time_s=3.0)
    assert [r.rank for r in profile.ranks] == [0, 1, 2]
    assert [r.worker for r in profile.ranks] == [w.name for w in cluster.workers]
    assert [r.relative_speed for r in profile.ranks] == [0.25, 0.5, 1.0]
    assert (profile.cluster, profile.model, profile.profiling_time_s) == (cluster.name, "mlp", 3.0)
    again = Profile.model_validate_json(profile.model_dump_json())  # as stored in S3
    assert again == profile
