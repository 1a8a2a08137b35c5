"""Validate once, probe once: one `hetflow demo` checks its job (the rules across models, the
recipe, the data it reads) once and asks each service once; a flow run with no command before
it does the same at its entry. The launch is replaced by a recorded run (`tests.run_records`):
what is counted happens before and around it, not in the ranks."""

from __future__ import annotations

import sys
from collections import Counter, OrderedDict

import pytest

from hetflow.config import ClusterSpec, DatasetSpec, TrackingConfig, TrainConfig

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]

CHECKS = ("check_job", "check_recipe", "check_fits", "check_devices")
PROBES = ("prefect_problem", "mlflow_problem", "s3_problem_line")


@pytest.fixture
def counted(monkeypatch) -> Counter:
    """Calls of each check and service probe, wherever hetflow's modules hold them; nothing
    remembered from earlier tests (`validated_job`'s jobs, the services that answered)."""
    from hetflow.infra import preflight
    from hetflow.tasks import train as train_module
    from hetflow.training import validated
    from hetflow.training.launch.run import Ran
    from hetflow.training.plan.ranks import RankMap

    from tests.run_records import run_of

    seen: Counter = Counter()
    monkeypatch.setattr(validated, "_jobs", OrderedDict())
    monkeypatch.setattr(preflight, "_answered", {})
    for name in CHECKS + PROBES:
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

    def recorded_run(cluster, plan, train, dataset, run_dir, **_):
        """The launch, replaced: a recorded run of the plan's batches, ranks as launched."""
        ranks = RankMap(cluster, plan)
        batches = [b for b in plan.local_batches if b > 0]
        result = run_of([batches] * train.steps, 0.05)
        return Ran(result, 1.0, ranks.finished(result), result.model_dump(mode="json"))

    monkeypatch.setattr(train_module, "run_plan", recorded_run)
    return seen


def _expect_once(seen: Counter) -> None:
    assert seen["check_job"] == 2  # the baseline's and the optimized config's, each once
    assert seen["check_recipe"] == seen["check_fits"] == seen["check_devices"] == 1


@pytest.mark.usefixtures("prefect_harness")
def test_one_demo_validates_its_job_once_and_asks_each_service_once(s3, counted):
    from hetflow.cli import main

    flags = ["--speeds", "1,2", "--steps", "4", "--global-batch", "16", "--recipe", "digits-mlp"]
    assert main(["demo", *flags]) == 0
    _expect_once(counted)
    assert {p: counted[p] for p in PROBES} == dict.fromkeys(PROBES, 1)


@pytest.mark.usefixtures("prefect_harness")
def test_a_flow_run_with_no_command_before_it_validates_once_at_its_entry(s3, counted):
    from hetflow.flows.compare import compare

    compare(
        cluster=ClusterSpec.from_speeds([1, 2]),
        dataset=DatasetSpec(),
        train=TrainConfig(recipe="digits-mlp", steps=4, global_batch=16),
        tracking=TrackingConfig(),
    )
    _expect_once(counted)
    assert counted["s3_problem_line"] == counted["mlflow_problem"] == 1
