"""Workers pinned to cores of their own (`WorkerSpec.cpus`): real mixed CPU speeds on one
host. The pinning is checked before launch and seen from inside the ranks."""

from __future__ import annotations

import pytest

from hetflow.config import TrainConfig
from hetflow.records import Plan
from hetflow.training.cores import host_cores

from tests.helpers.training.cores import _cluster


@pytest.mark.slow
@pytest.mark.timeout(300)
@pytest.mark.skipif(len(host_cores()) < 2, reason="needs two cores")
def test_each_rank_runs_on_its_own_core(digits, tmp_path):
    from hetflow.training.launch.run import run_plan

    cluster = _cluster(1, 1, emulate=False)
    train = TrainConfig(recipe="digits-mlp", global_batch=32, steps=2, eval_every=100)
    ran = run_plan(cluster, Plan.equal([16, 16]), train, digits, tmp_path / "r", variant="b")
    cores = [r.cores for r in sorted(ran.result.ranks, key=lambda r: r.rank)]
    assert cores == [host_cores()[:1], host_cores()[1:2]]
