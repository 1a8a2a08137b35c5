"""One resolved job: built once where a flow starts, frozen, passed down (no process-wide cache
stands in for passing it), carried to the ranks in the run spec, which resolve nothing again.

The demo counts each check, resolution and service probe of one `hetflow demo`, its launch
replaced by a recorded run (`tests.run_records`); the ranks' side runs the worker on real gloo
ranks with every resolver replaced by one that fails."""

from __future__ import annotations

import sys
from collections import Counter

import pytest

from hetflow.config import ClusterSpec, DatasetSpec, TrackingConfig, TrainConfig
from hetflow.training.job import ResolvedJob, resolve_job
from hetflow.training.loop.optim import is_resolved

from tests.dist import run_ranks
from tests.helpers.training.resolved_job import _count

CHECKS = ("check_job", "check_recipe", "check_fits", "check_devices")


RESOLVERS = ("resolve_optimizer", "resolve_rounds", "read_manifest", "resolve_job", "recipe_of")


PROBES = ("prefect_problem", "mlflow_problem", "s3_problem_line")


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
