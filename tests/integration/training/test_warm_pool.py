"""A session's warm pool (`training.elastic.pool`) on real processes: the jobs launched while
it is open take every rank's process from it, it starts one behind each it gives out, and it
outlives each job, so the next job's ranks are processes started before it was submitted."""

from __future__ import annotations

from pathlib import Path

import pytest

from hetflow.config import ClusterSpec, TrainConfig
from hetflow.records import Plan, RunResult
from hetflow.training.elastic.launch import start_elastic
from hetflow.training.elastic.pool import current, session_pool
from hetflow.training.launch.live import Handle, registered
from hetflow.training.launch.spec import RunSpec

STEPS = 6


def _spec(dataset, run_dir: Path, on_loss: str = "continue") -> RunSpec:
    train = TrainConfig(
        recipe="digits-mlp",
        global_batch=32,
        steps=STEPS,
        checkpoint_every=STEPS,
        eval_every=STEPS,
        faults={"on_loss": on_loss},
    )
    return RunSpec(
        run_name=run_dir.name,
        variant="t",
        cluster=ClusterSpec.from_speeds([1, 1], time_scale=20.0),
        dataset=dataset,
        train=train,
        plan=Plan.equal([16, 16]),
        run_dir=str(run_dir),
    )


def _run(spec: RunSpec):
    job = start_elastic(spec, timeout_s=200)
    pids = {r: p.pid for r, p in job.procs.items()}
    with registered(spec.run_dir, Handle(job)):
        return job.wait(), pids


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_jobs_in_turn_take_their_ranks_from_the_session_pool(local_digits, tmp_path):
    with session_pool(2) as pool:
        assert pool.wait_ready(120)  # both imported, one after the other
        ahead = {p.pid for p in pool.waiting}
        first, pids = _run(_spec(local_digits, tmp_path / "a"))
        assert set(pids.values()) == ahead  # both ranks were the pool's, started ahead
        assert pool.given[""] == 2 and pool.wait_ready(120)  # and two more wait behind them
        behind = {p.pid for p in pool.waiting}
        assert not behind & ahead and all(p.poll() is None for p in pool.waiting)
        second, pids = _run(_spec(local_digits, tmp_path / "b"))
        assert set(pids.values()) == behind
        assert pool.wait_ready(120)
        rest = list(pool.waiting)
    assert current() is None and all(p.poll() is not None for p in rest)  # ended with it
    for launched in (first, second):
        result = RunResult.model_validate(launched.raw)
        assert sorted(r.rank for r in result.ranks) == [0, 1]
        assert [rec.step for rec in result.lead.records] == list(range(STEPS))


@pytest.mark.timeout(60)
def test_a_pool_whose_workers_cannot_start_gives_none_and_stops_refilling(tmp_path):
    """A warm worker that ends before it is ready (a broken install): the pool says so, gives
    no worker (the launcher starts its ranks cold) and starts no more."""
    import sys

    from hetflow.training.launch.pool import WarmPool

    with WarmPool(2, [sys.executable, "-c", "raise SystemExit(3)"]) as pool:
        assert not pool.wait_ready(30) and pool.broken
        assert pool.take({"log": str(tmp_path / "log")}, {"RANK": "0"}) is None
        assert not pool.given
        pool.filler.join(timeout=10)
        assert not pool.filler.is_alive()  # no more started


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_torchrun_jobs_in_turn_take_warm_agents_and_no_more_than_expected(local_digits, tmp_path):
    """Two torchrun jobs in turn, an agents' pool open for two launches: each job's agent
    was one of the pool's (imported before its submit), and no third was started."""
    from hetflow.training.launch.agents import agent_pool
    from hetflow.training.launch.run import run_workers

    with agent_pool(2) as pool:
        for name in ("a", "b"):
            assert pool.wait_ready(120)
            raw, _ = run_workers(_spec(local_digits, tmp_path / name, on_loss="restart"))
            result = RunResult.model_validate(raw)
            assert [rec.step for rec in result.lead.records] == list(range(STEPS))
        assert pool.given.total() == 2 and pool.started == 2 and pool.waiting == []
    log = (tmp_path / "b" / "workers.log").read_text()
    assert "ready" not in log.splitlines()  # the agent's word to the pool stayed in its pipe
