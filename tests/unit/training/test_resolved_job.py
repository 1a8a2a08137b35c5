"""One resolved job: built once where a flow starts, frozen, passed down (no process-wide cache
stands in for passing it), carried to the ranks in the run spec, which resolve nothing again.

The demo counts each check, resolution and service probe of one `hetflow demo`, its launch
replaced by a recorded run (`tests.run_records`); the ranks' side runs the worker on real gloo
ranks with every resolver replaced by one that fails."""

from __future__ import annotations

import dataclasses
from collections import Counter

import pytest

from hetflow.config import ClusterSpec, TrackingConfig, TrainConfig
from hetflow.training.job import job_for, resolve_job
from hetflow.training.loop.optim import is_resolved

from tests.helpers.training.resolved_job import _count

# -- the value -----------------------------------------------------------------------------------


def test_a_resolved_job_is_frozen_and_holds_its_configs_resolved():
    given = TrainConfig(recipe="digits-mlp").compared()
    job = resolve_job(ClusterSpec.from_speeds([1, 2]), list(given.values()))
    with pytest.raises(dataclasses.FrozenInstanceError):
        job.configs = ()  # type: ignore[misc]
    assert job.given == tuple(given.values())
    assert all(is_resolved(c) for c in job.configs)
    assert not any(is_resolved(c) for c in given.values())
    assert [job.resolved(c).schedule for c in given.values()] == [
        c.schedule for c in given.values()
    ]
    assert job.placement.devices == ["cpu", "cpu"] and job.placement.backend == "gloo"


def test_a_launch_of_the_jobs_cluster_takes_its_placement_and_another_cluster_none():
    cluster = ClusterSpec.from_speeds([1, 2])
    job = resolve_job(cluster, [TrainConfig(recipe="digits-mlp")])
    typed = cluster.model_copy(  # what `tasks.opening` may fill in: the placement holds
        update={"workers": [w.model_copy(update={"speed": 3.0}) for w in cluster.workers]}
    )
    assert job.placement_of(cluster) is job.placement is job.placement_of(typed)
    part = cluster.model_copy(update={"workers": cluster.workers[1:]})  # local ranks move
    gpu = cluster.model_copy(
        update={"workers": [w.model_copy(update={"device": "cuda"}) for w in cluster.workers]}
    )
    assert job.placement_of(part) is None and job.placement_of(gpu) is None


def test_the_fp16_rule_is_checked_for_every_config_of_a_job_against_one_placement(monkeypatch):
    """A comparison's optimized variant may try local SGD (`allow_local_sgd`), its baseline
    not: the job refuses it before the baseline runs, with one placement resolved."""
    import hetflow.training.devices as devices
    from hetflow.config import ConfigError

    fp16 = devices.Placement(["cuda:0", "cuda:1"], ["fp16", "fp16"], "nccl")
    calls = []
    monkeypatch.setattr(devices, "check_devices", lambda c, t: calls.append(t) or fp16)
    base = TrainConfig(recipe="digits-mlp")
    given = base.model_copy(update={"allow_local_sgd": True}).compared()
    with pytest.raises(ConfigError, match=r"^cluster\.workers\[w0\]\.precision: resolves to fp16"):
        resolve_job(ClusterSpec.from_speeds([1, 2]), list(given.values()))
    assert len(calls) == 1 and not calls[0].local_sgd()  # the baseline's, once
    assert resolve_job(ClusterSpec.from_speeds([1, 2]), list(base.compared().values()))


def test_nothing_is_remembered_between_resolutions_and_a_job_given_is_used_as_it_is(monkeypatch):
    import hetflow.training  # noqa: F401  (the modules the counter patches)

    seen = _count(monkeypatch, ("check_job", "resolve_optimizer", "check_devices"))
    cluster, configs = ClusterSpec.from_speeds([1, 2]), [TrainConfig(recipe="digits-mlp")]
    first = resolve_job(cluster, configs)
    assert seen == {"check_job": 1, "resolve_optimizer": 1, "check_devices": 1}
    again = resolve_job(cluster, configs)  # no cache: a second call checks again
    assert again == first and again is not first and seen["check_job"] == 2
    assert job_for(first, cluster, configs) is first and seen["check_job"] == 2
    with pytest.raises(ValueError, match="another cluster"):
        job_for(first, ClusterSpec.from_speeds([1, 3]), configs)


def test_services_that_answered_are_passed_down_not_remembered(monkeypatch):
    from hetflow.infra import preflight

    asked: Counter = Counter()
    monkeypatch.setattr(preflight, "mlflow_problem", lambda t: asked.update(["mlflow"]))
    tracking = TrackingConfig(tracking_uri="http://127.0.0.1:5000")
    reached = preflight.check_services(tracking=tracking)
    assert asked["mlflow"] == 1 and ("mlflow", tracking.tracking_uri) in reached.answered
    assert preflight.check_services(tracking=tracking, reached=reached) == reached
    assert asked["mlflow"] == 1  # passed down: not asked again
    preflight.check_services(tracking=tracking)
    assert asked["mlflow"] == 2  # not passed: asked again, nothing kept in the process
