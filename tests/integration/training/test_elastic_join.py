"""Workers that join a running job in place under `faults.on_loss: continue`, on real
processes: a late worker is admitted at a step boundary, receives the weights, optimizer and
plan from the leader and takes a share from the step it joins at; no step is redone, the
replicas end equal; the bad cases of a join end in a run that goes on, never a hang."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from hetflow.config import ClusterSpec, TrainConfig, WorkerSpec
from hetflow.infra.report.plots import rank_rows
from hetflow.records import Plan, RunResult
from hetflow.training.elastic.launch import start_elastic
from hetflow.training.launch.outcome import LaunchError
from hetflow.training.launch.run import run_workers
from hetflow.training.launch.spec import Injection, RunSpec
from hetflow.training.plan.learned import learned_entries

STEPS, GLOBAL, LATE, AT, SCALE = 30, 64, 3, 4, 20.0


def _spec(dataset, run_dir: Path, inject=(), join_at=None, warm=0, replace=False) -> RunSpec:
    train = TrainConfig(
        recipe="digits-mlp",
        global_batch=GLOBAL,
        steps=STEPS,
        checkpoint_every=10,
        eval_every=10,
        faults={
            "on_loss": "continue",
            "join_at": {LATE: AT} if join_at is None else join_at,
            "warm_workers": warm,
            "replace": replace,
        },
    )
    return RunSpec(
        run_name=run_dir.name,
        variant="t",
        cluster=ClusterSpec.from_speeds([1, 1, 2, 4], time_scale=SCALE),
        dataset=dataset,
        train=train,
        plan=Plan.equal([16, 16, 16, 16]),
        run_dir=str(run_dir),
        inject=[Injection(rank=r, step=s, kind=k) for r, s, k in inject],
    )


def _joined(result: RunResult, joiner: int = LATE) -> int:
    """The step `joiner` joined at: every rank records the same change; before it the others'
    shares make the global batch without it, from it on with it; every rank ran each of its
    steps once, in order; the replicas end equal."""
    by_rank = {r.rank: r for r in result.ranks}
    assert sorted(by_rank) == [0, 1, 2, 3]
    joins = {r.rank: [c for c in r.recovery.membership if joiner in c.joined] for r in result.ranks}
    (change,) = joins[joiner]
    at = change.step
    assert AT < at < STEPS and change.world == 4 and change.plan[joiner] > 0
    for (c,) in joins.values():
        assert (c.step, c.plan) == (at, change.plan)
    for r in result.ranks:
        first = at if r.rank == joiner else 0
        assert [rec.step for rec in r.records] == list(range(first, STEPS))
    for step in range(STEPS):
        batches = [
            by_rank[r].records[step - (at if r == joiner else 0)].batch
            for r in by_rank
            if r != joiner or step >= at
        ]
        assert sum(batches) == GLOBAL
    assert len({r.recovery.replica_digest for r in result.ranks}) == 1
    return at


@pytest.mark.slow
@pytest.mark.timeout(240)
def test_a_late_worker_joins_in_place_and_takes_a_share(local_digits, tmp_path):
    spec = _spec(local_digits, tmp_path / "join")
    raw, _ = run_workers(spec, timeout_s=200)
    result = RunResult.model_validate(raw)
    _joined(result)
    lead = result.lead
    assert lead.rank == 0 and [e.step for e in lead.evals] == [10, 20, 30]
    joiner = next(r for r in result.ranks if r.rank == LATE)
    phases = joiner.recovery.membership[0].join_s
    assert {"admit_s", "state_s", "rebuild_s"} <= set(phases)


def _went_on(result: RunResult, ranks: list[int], lost: list[int]) -> None:
    """The ranks `ranks` ran every step once, in order, the global batch whole at each; the
    last change lost `lost`; the replicas end equal."""
    assert sorted(r.rank for r in result.ranks) == ranks
    for r in result.ranks:
        assert [rec.step for rec in r.records] == list(range(STEPS))
        assert set(lost) <= {m for c in r.recovery.membership for m in c.lost}
    last = max(c.step for c in result.ranks[0].recovery.membership)
    for step in range(last, STEPS):  # the ranks of the last generation make the global batch
        assert sum(r.records[step].batch for r in result.ranks) == GLOBAL
    assert len({r.recovery.replica_digest for r in result.ranks}) == 1


@pytest.mark.slow
@pytest.mark.timeout(240)
def test_a_joiner_killed_while_receiving_is_dropped_and_the_others_go_on(local_digits, tmp_path):
    spec = _spec(local_digits, tmp_path / "dies", inject=[(LATE, AT, "kill_receiving")])
    raw, _ = run_workers(spec, timeout_s=200)
    _went_on(RunResult.model_validate(raw), [0, 1, 2], [LATE])


@pytest.mark.slow
@pytest.mark.timeout(240)
def test_a_sender_that_stalls_is_left_behind_with_the_join(local_digits, tmp_path):
    spec = _spec(local_digits, tmp_path / "stalls", inject=[(0, AT, "stop_sending")])
    raw, _ = run_workers(spec, timeout_s=200)
    result = RunResult.model_validate(raw)
    _went_on(result, [1, 2], [0, LATE])
    assert result.lead.rank == 1  # it took rank 0's part: the result, the last evaluation
    assert result.lead.evals[-1].step == STEPS


@pytest.mark.slow
@pytest.mark.timeout(240)
def test_two_joins_and_a_loss_at_once_all_resolve(local_digits, tmp_path):
    # two late workers ready together (one admitted per generation: the second waits for
    # the next) while rank 1 is killed around the same steps
    spec = _spec(
        local_digits, tmp_path / "busy", inject=[(1, AT + 3, "kill")], join_at={2: AT, 3: AT}
    )
    raw, _ = run_workers(spec, timeout_s=200)
    result = RunResult.model_validate(raw)
    by_rank = {r.rank: r for r in result.ranks}
    assert sorted(by_rank) == [0, 2, 3]
    assert [rec.step for rec in by_rank[0].records] == list(range(STEPS))
    for r in (2, 3):
        steps = [rec.step for rec in by_rank[r].records]
        assert steps == list(range(steps[0], STEPS))  # from its join on, once each
    last = max(c.step for c in by_rank[0].recovery.membership)
    assert {m for c in by_rank[0].recovery.membership for m in c.lost} == {1}
    for step in range(last, STEPS):  # the ranks of the last generation make the global batch
        assert sum(r.records[step - r.records[0].step].batch for r in result.ranks) == GLOBAL
    assert len({r.recovery.replica_digest for r in result.ranks}) == 1


@pytest.mark.slow
@pytest.mark.timeout(240)
def test_the_launcher_api_releases_a_worker_and_adds_it_back_in_place(local_digits, tmp_path):
    spec = _spec(local_digits, tmp_path / "api", join_at={}, warm=1)
    spec = spec.model_copy(update={"run_dir": str(tmp_path / "api")})
    job = start_elastic(spec, timeout_s=200)
    progress = tmp_path / "api" / "progress.json"
    _until(lambda: progress.exists() and json.loads(progress.read_text())["step"] >= 3)
    job.release(LATE)
    _until(lambda: job.procs[LATE].poll() is not None)  # it left at a boundary, status 0
    assert job.procs[LATE].returncode == 0
    with pytest.raises(ValueError, match="no free slot .* 'nope'"):
        job.add_worker(WorkerSpec(name="nope", speed=9.0))
    # back in its place: a spare of its type, under a name of its own
    assert job.add_worker(WorkerSpec(name="spare", speed=4.0)) == LATE
    result = RunResult.model_validate(job.wait().raw)
    changes = result.lead.recovery.membership
    assert [(c.lost, c.joined) for c in changes] == [([LATE], []), ([], [LATE])]
    joiner = next(r for r in result.ranks if r.rank == LATE)
    assert joiner.records[0].step == changes[1].step
    assert len({r.recovery.replica_digest for r in result.ranks}) == 1
    # the leaver's steps kept under its name, the spare's under its own
    (left,) = result.departed
    assert (left.rank, left.worker) == (LATE, "w3")
    assert [rec.step for rec in left.records] == list(range(changes[0].step))
    assert [r.worker for r in result.ranks] == ["w0", "w1", "w2", "spare"]
    assert [c.workers for c in changes] == [
        {0: "w0", 1: "w1", 2: "w2"},
        {0: "w0", 1: "w1", 2: "w2", 3: "spare"},
    ]
    entries = learned_entries(spec.cluster, spec.train, result, "20260101T000000000000Z")
    assert {e.rank.worker: e.key.kind for e in entries} == {
        "w0": "speed-1",
        "w2": "speed-2",
        "spare": "speed-4",  # the ranks at the end first: the spare's steps, not w3's
    }
    assert rank_rows(result, spec.cluster)[1][3:] == [
        "spare",
        f"w3 · 4x (left before step {changes[0].step})",
    ]


@pytest.mark.slow
@pytest.mark.timeout(150)
def test_a_joiner_whose_last_member_leaves_is_told_at_once(local_digits, tmp_path):
    """The job's only member is released while a worker it was grown onto still asks to
    join: nobody is left to admit it, so the leaver marks the run over and the joiner ends
    at once (not after its patience, minutes), and the job ends, without a result."""
    spec = _spec(local_digits, tmp_path / "last", join_at={}, warm=1)
    faults = spec.train.faults.model_copy(update={"spare": ["w1", "w2", "w3"]})
    spec = spec.model_copy(
        update={"train": spec.train.model_copy(update={"steps": 400, "faults": faults})}
    )
    job = start_elastic(spec, timeout_s=120)
    progress = tmp_path / "last" / "progress.json"
    _until(lambda: progress.exists() and json.loads(progress.read_text())["step"] >= 3)
    rank = job.add_worker(WorkerSpec(name="w1", speed=1.0))
    job.release(0)
    with pytest.raises(LaunchError, match="no result"):
        job.wait()
    log = (tmp_path / "last" / "workers.log").read_text()
    assert "rank 0: leaving the job" in log
    assert f"rank {rank}: could not join (rank {rank}: not admitted to the job)" in log


@pytest.mark.slow
@pytest.mark.timeout(240)
def test_a_lost_worker_is_replaced_in_place(local_digits, tmp_path):
    spec = _spec(local_digits, tmp_path / "replace", [(2, 4, "kill")], join_at={}, replace=True)
    raw, _ = run_workers(spec, timeout_s=200)
    result = RunResult.model_validate(raw)
    assert sorted(r.rank for r in result.ranks) == [0, 1, 2, 3]
    changes = result.lead.recovery.membership
    assert [(c.lost, c.joined) for c in changes] == [([2], []), ([], [2])]
    replacement = next(r for r in result.ranks if r.rank == 2)
    assert [rec.step for rec in replacement.records] == list(range(changes[1].step, STEPS))
    # the replacement runs as its slot's worker; the lost one's steps are kept apart
    assert replacement.worker == "w2" and changes[1].workers[2] == "w2"
    assert 2 not in changes[0].workers and result.departed == []
    (gone,) = result.lost
    assert gone.worker == "w2" and [rec.step for rec in gone.records] in (
        list(range(changes[0].step - 1)),
        list(range(changes[0].step)),
    )
    assert [rec.step for rec in result.lead.records] == list(range(STEPS))
    assert len({r.recovery.replica_digest for r in result.ranks}) == 1


def _until(pred, limit_s: float = 120.0) -> None:
    end = time.monotonic() + limit_s
    while not pred():
        assert time.monotonic() < end, "the job did not get there"
        time.sleep(0.05)
