"""Workers given a kernel-enforced share of the CPU (`WorkerSpec.cpu_quota`): refused in one line
where the host cannot enforce it; otherwise each rank runs in a cgroup of its own, under its
quota as the kernel reports it, and the cgroups are gone after the job, also when a rank died."""

from __future__ import annotations

import pytest

from hetflow.config import TrainConfig
from hetflow.records import Plan
from hetflow.training.cpu_quota import (
    GROUP,
)

from tests.helpers.training.cpu_quota import CONTROLLER, _cluster, needs_quotas


@pytest.mark.slow
@pytest.mark.timeout(300)
@needs_quotas
def test_each_rank_runs_under_its_own_quota_and_its_cgroup_goes_after(digits, tmp_path):
    from hetflow.training.launch.run import run_plan

    cluster = _cluster(1.0, 0.25)
    train = TrainConfig(recipe="digits-mlp", global_batch=32, steps=4, eval_every=100)
    ran = run_plan(cluster, Plan.equal([16, 16]), train, digits, tmp_path / "r", variant="q")
    quotas = [r.cpu_quota for r in sorted(ran.result.ranks, key=lambda r: r.rank)]
    assert quotas == [1.0, 0.25]  # read from the kernel inside each rank
    assert not list((CONTROLLER.root / GROUP).glob("r*/rank*"))  # this job's are gone


@pytest.mark.slow
@pytest.mark.timeout(300)
@needs_quotas
def test_the_cgroups_are_removed_when_a_rank_dies(digits, tmp_path):
    from hetflow.training.launch.outcome import LaunchError
    from hetflow.training.launch.run import run_workers
    from hetflow.training.launch.spec import Injection, RunSpec

    spec = RunSpec(
        run_name="hf-test-dies",
        variant="q",
        cluster=_cluster(0.5, 0.5),
        dataset=digits,
        train=TrainConfig(recipe="digits-mlp", global_batch=32, steps=8, eval_every=100),
        plan=Plan.equal([16, 16]),
        inject=[Injection(kind="raise", rank=1, step=2)],
        run_dir=str(tmp_path / "dies"),
    )
    with pytest.raises(LaunchError):
        run_workers(spec)
    assert not CONTROLLER.job_dir("hf-test-dies").exists()
