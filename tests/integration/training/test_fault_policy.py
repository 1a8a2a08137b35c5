"""One failure policy (`TrainConfig.faults`): torchrun, Ray Train and the Prefect train task
each take how many times they retry, and how, from it. What is replaced here is the process
each layer would start (torchrun, a Ray Train fit, the launch under Prefect); real restarts are
in test_rank_faults.py, test_ray.py and test_flow_retry.py."""

from __future__ import annotations

import pytest

from hetflow.config import ClusterSpec, TrainConfig
from hetflow.training.launch.outcome import LaunchError

from tests.helpers.training.fault_policy import POLICY


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_a_lost_launch_is_retried_by_prefect_as_often_as_the_policy_says(
    digits, prefect_harness, hetflow_home, monkeypatch
):
    from prefect import flow

    import hetflow.tasks.train as train_module
    from hetflow.config import TrackingConfig

    from tests.profiles import profile_of, rank_profile

    launches = []

    def lost(*args, **kwargs):
        launches.append(args)
        raise LaunchError("torchrun exited -9")

    monkeypatch.setattr(train_module, "run_plan", lost)
    cluster = ClusterSpec.from_speeds([1, 1])
    profile = profile_of([rank_profile(0, 100.0), rank_profile(1, 100.0)])
    train = TrainConfig(recipe="digits-mlp", global_batch=16, steps=2, faults=POLICY)

    @flow
    def one_variant():
        return train_module.train_task(train.faults)(
            "optimized", cluster, digits, train, profile, TrackingConfig()
        )

    with pytest.raises(LaunchError):
        one_variant()
    assert len(launches) == 1 + POLICY.task_retries
