"""One failure policy (`TrainConfig.faults`): torchrun, Ray Train and the Prefect train task
each take how many times they retry, and how, from it. What is replaced here is the process
each layer would start (torchrun, a Ray Train fit, the launch under Prefect); real restarts are
in test_rank_faults.py, test_ray.py and test_flow_retry.py."""

from __future__ import annotations

import pytest

from hetflow.config import ClusterSpec, DatasetSpec, FaultPolicy, TrainConfig
from hetflow.records import Plan
from hetflow.training.launch import local
from hetflow.training.launch.outcome import LaunchError
from hetflow.training.launch.spec import RunSpec

from tests.helpers.training.fault_policy import POLICY


class Stop(Exception):
    """Raised by a replaced launcher once it has seen what it was asked."""


def _spec(tmp_path, faults: FaultPolicy, launcher="local") -> RunSpec:
    return RunSpec(
        run_name="r",
        variant="r",
        cluster=ClusterSpec.from_speeds([1, 1]).model_copy(update={"launcher": launcher}),
        dataset=DatasetSpec(url="s3://bucket/digits"),
        train=TrainConfig(recipe="digits-mlp", global_batch=8, steps=1, faults=faults),
        plan=Plan.equal([4, 4]),
        run_dir=str(tmp_path / "r"),
    )


def test_the_defaults_are_valid_and_bad_values_name_the_field():
    assert TrainConfig().faults == FaultPolicy()
    with pytest.raises(ValueError, match="group_restarts"):
        TrainConfig.model_validate({"faults": {"group_restarts": -1}})


@pytest.mark.parametrize("restarts", [0, 5])
def test_torchrun_restarts_the_group_as_the_policy_says(tmp_path, monkeypatch, restarts):
    seen = {}

    def command(*args, **kwargs):
        seen.update(kwargs)
        raise Stop

    monkeypatch.setattr(local, "torchrun_command", command)
    with pytest.raises(Stop):
        local.run_torchrun(_spec(tmp_path, FaultPolicy(group_restarts=restarts)))
    assert seen["max_restarts"] == restarts


def test_ray_trains_failure_config_is_the_policys():
    pytest.importorskip("ray")
    from hetflow.training.launch.ray_train import failure_config

    config = failure_config(POLICY)
    assert config.max_failures == POLICY.group_restarts
    assert config.controller_failure_limit == POLICY.placement_tries - 1


class _Unplaced(Exception):
    """What Ray Train raises when it gave up placing the group (by its failure's name)."""

    def __init__(self):
        super().__init__("start timed out")
        self.controller_failure = type("WorkerGroupStartupTimeoutError", (), {})()


@pytest.mark.parametrize("go_on", [True, False])
def test_a_lost_node_is_gone_on_without_only_where_the_policy_allows(tmp_path, monkeypatch, go_on):
    ray = pytest.importorskip("ray")
    from hetflow.training.launch import ray_train

    fits: list[RunSpec] = []

    def fit(spec, attempt):
        fits.append(spec)
        if attempt == 0:
            raise _Unplaced

    monkeypatch.setattr(ray_train, "connect", lambda address: None)
    monkeypatch.setattr(ray, "nodes", lambda: [])
    monkeypatch.setattr(ray_train, "_fit", fit)
    monkeypatch.setattr(ray_train, "unplaceable", lambda *a: {"w1": "its node was lost"})
    monkeypatch.setattr(ray_train, "_read_result", lambda spec, run_dir: {"ranks": []})
    spec = _spec(tmp_path, FaultPolicy(go_on_without=go_on), launcher="ray")
    if go_on:
        ray_train.run_workers_ray(spec)
        assert [w.name for w in fits[-1].cluster.workers] == ["w0"]
    else:
        with pytest.raises(LaunchError, match=r"w1 .*train.faults.go_on_without is off"):
            ray_train.run_workers_ray(spec)
        assert len(fits) == 1


def test_the_train_task_is_retried_as_the_policy_says():
    from hetflow.tasks.train import train_task

    task = train_task(POLICY)
    assert task.retries == POLICY.task_retries
    assert task.retry_delay_seconds == POLICY.task_retry_delay_s
