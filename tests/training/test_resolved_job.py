"""One resolved job: built once where a flow starts, frozen, passed down (no process-wide cache
stands in for passing it), carried to the ranks in the run spec, which resolve nothing again.

The demo counts each check, resolution and service probe of one `hetflow demo`, its launch
replaced by a recorded run (`tests.run_records`); the ranks' side runs the worker on real gloo
ranks with every resolver replaced by one that fails."""

from __future__ import annotations

import dataclasses
import sys
from collections import Counter

import pytest

from hetflow.config import ClusterSpec, DatasetSpec, TrackingConfig, TrainConfig
from hetflow.training.job import ResolvedJob, job_for, resolve_job
from hetflow.training.loop.optim import is_resolved

from tests.dist import run_ranks

CHECKS = ("check_job", "check_recipe", "check_fits", "check_devices")
RESOLVERS = ("resolve_optimizer", "resolve_rounds", "read_manifest", "resolve_job", "recipe_of")
PROBES = ("prefect_problem", "mlflow_problem", "s3_problem_line")


def _count(monkeypatch, names) -> Counter:
    """Calls of each function `names` names, wherever hetflow's modules hold it."""
    seen: Counter = Counter()
    for name in names:
        holders = [
            m for n, m in list(sys.modules.items()) if n.startswith("hetflow") and hasattr(m, name)
        ]
        real = getattr(holders[0], name)

        def wrapper(*args, _real=real, _name=name, **kwargs):
            seen[_name] += 1
            return _real(*args, **kwargs)

        for module in holders:
            if getattr(module, name) is real:
                monkeypatch.setattr(module, name, wrapper)
    return seen


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


# -- one flow run --------------------------------------------------------------------------------


@pytest.fixture
def counted(monkeypatch) -> Counter:
    """Calls of each check, resolution and service probe; the launch replaced by a recorded
    run of the plan's batches, whose spec's train config is kept in `counted.launched`."""
    from hetflow.tasks import train as train_module
    from hetflow.training.launch.run import Ran
    from hetflow.training.plan.ranks import RankMap

    from tests.run_records import run_of

    seen = _count(monkeypatch, CHECKS + RESOLVERS + PROBES)
    seen.launched, seen.placements = [], []

    def recorded_run(cluster, plan, train, dataset, run_dir, **kw):
        """The launch, replaced: a recorded run of the plan's batches, ranks as launched."""
        seen.launched.append(train)
        seen.placements.append(kw.get("placement"))
        ranks = RankMap(cluster, plan)
        batches = [b for b in plan.local_batches if b > 0]
        result = run_of([batches] * train.steps, 0.05)
        return Ran(result, 1.0, ranks.finished(result), result.model_dump(mode="json"))

    monkeypatch.setattr(train_module, "run_plan", recorded_run)
    return seen


def _expect_once(seen: Counter) -> None:
    assert seen["check_job"] == 2  # the baseline's and the optimized config's, each once
    assert seen["resolve_job"] == seen["resolve_optimizer"] == 1
    assert seen["check_fits"] == seen["check_devices"] == seen["recipe_of"] == 1
    # each launch takes the job's placement, not a second `check_devices`
    assert len(seen.placements) == 2 and None not in seen.placements
    assert seen["check_recipe"] == 0  # its parts, the recipe and the optimizer, resolved once
    assert seen["read_manifest"] <= 1  # the dataset's, read where it is ingested, if it is
    assert all(is_resolved(t) for t in seen.launched) and len(seen.launched) == 2


@pytest.mark.slow
@pytest.mark.timeout(300)
@pytest.mark.usefixtures("prefect_harness")
def test_one_demo_resolves_its_job_once_and_asks_each_service_once(s3, counted):
    from hetflow.cli import main

    flags = ["--speeds", "1,2", "--steps", "4", "--global-batch", "16", "--recipe", "digits-mlp"]
    assert main(["demo", *flags]) == 0
    _expect_once(counted)
    assert {p: counted[p] for p in PROBES} == dict.fromkeys(PROBES, 1)


@pytest.mark.slow
@pytest.mark.timeout(300)
@pytest.mark.usefixtures("prefect_harness")
def test_a_flow_run_with_no_command_before_it_resolves_once_at_its_entry(s3, counted):
    from hetflow.flows.compare import compare

    compare(
        cluster=ClusterSpec.from_speeds([1, 2]),
        dataset=DatasetSpec(),
        train=TrainConfig(recipe="digits-mlp", steps=4, global_batch=16, strategy="diloco"),
        tracking=TrackingConfig(),
    )
    _expect_once(counted)
    assert counted["resolve_rounds"] == 2  # once per variant, from its plan (ddp: no rounds)
    diloco = next(t for t in counted.launched if t.strategy == "diloco")
    assert diloco.steps == 4 and diloco.diloco.rounds == 1  # 4 steps' samples: one round
    assert counted["s3_problem_line"] == counted["mlflow_problem"] == 1


# -- the ranks -----------------------------------------------------------------------------------

RANK_RESOLVERS = ("resolve_optimizer", "resolve_rounds", "check_recipe", "check_devices")


def worker_without_resolvers(rank: int, world: int, arg: dict) -> dict:
    """One rank of the worker (`worker.run`) on the run spec `arg`, every resolver in every
    hetflow module replaced by one that raises: the rank runs on what the spec carries."""
    import hetflow.training.worker as worker
    from hetflow.training.launch.spec import RunSpec

    def refuse(*_, **__):
        raise AssertionError("a rank resolved what its run spec carries")

    for name, module in list(sys.modules.items()):
        if name.startswith("hetflow"):
            for resolver in RANK_RESOLVERS:
                if hasattr(module, resolver):
                    setattr(module, resolver, refuse)
    spec = RunSpec.model_validate(arg)
    worker.run(spec, rank)
    return {"rank": rank}


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_the_run_spec_carries_the_resolved_job_and_the_ranks_resolve_nothing(
    local_digits, tmp_path
):
    import json

    from hetflow.records import RunResult
    from hetflow.training.launch.ready import launch_ready
    from hetflow.training.launch.spec import RunSpec
    from hetflow.training.plan.planner import make_plan
    from hetflow.training.plan.prior import equal_prior
    from hetflow.training.plan.rounds import resolve_rounds

    cluster = ClusterSpec.from_speeds([1, 2])
    given = TrainConfig(
        recipe="digits-mlp", strategy="diloco", steps=8, global_batch=16, eval_every=4
    )
    job: ResolvedJob = resolve_job(cluster, [given])
    plan = make_plan(equal_prior(cluster, given), cluster, job.configs[0])
    train = resolve_rounds(job.configs[0], plan)  # what the train task launches
    spec = RunSpec(
        run_name="carried",
        variant="diloco",
        cluster=cluster,
        dataset=local_digits,
        train=train,
        plan=plan,
        run_dir=str(tmp_path),
    )
    assert launch_ready(spec) is spec  # nothing left to resolve before launch either
    carried = json.loads(spec.model_dump_json())["train"]
    assert carried["optimizer"] == "sgd" and carried["steps"] == 8
    assert carried["diloco"]["rounds"] == train.diloco.rounds
    run_ranks(worker_without_resolvers, 2, spec.model_dump(mode="json"), tmp_path)
    result = RunResult.model_validate_json((tmp_path / "result.json").read_text())
    assert len(result.ranks[0].records) == train.diloco.rounds
