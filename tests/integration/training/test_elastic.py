"""Workers lost from a running job under `faults.on_loss: continue`, on real processes: the
ranks left keep their processes and state, regroup, re-cut the global batch over themselves and
go on from the step they were at; no step is redone or half-applied, and no case hangs."""

from __future__ import annotations

from pathlib import Path

import pytest

from hetflow.infra.report.plots import rank_rows
from hetflow.records import RunResult
from hetflow.training.launch.outcome import LaunchError, RankFailed
from hetflow.training.launch.run import run_workers
from hetflow.training.loop.checkpoint_store import CheckpointStore
from hetflow.training.metrics import summarize
from hetflow.training.plan.learned import learned_entries

from tests.helpers.training.elastic import GLOBAL, STEPS, _spec


def _survived(result: RunResult, lost: list[int], at: int, in_flight: str = "retried") -> None:
    """Every rank left ran each step once, in order; the regroup is recorded alike on each;
    from it on, the shares of the ranks left make the global batch; the replicas are equal."""
    ranks = sorted(r.rank for r in result.ranks)
    assert ranks == [r for r in range(4) if r not in lost]
    for r in result.ranks:
        assert [rec.step for rec in r.records] == list(range(STEPS))  # none redone, none lost
        (change,) = r.recovery.membership
        assert (change.step, sorted(change.lost), change.world) == (at, lost, 4 - len(lost))
        assert change.step_in_flight == in_flight  # killed mid-step: no rank applied it
        assert sum(change.plan) == GLOBAL and all(change.plan[m] == 0 for m in lost)
    for step in range(at, STEPS):
        assert sum(r.records[step].batch for r in result.ranks) == GLOBAL
    assert len({r.recovery.replica_digest for r in result.ranks}) == 1


def _kept(result: RunResult, lost: list[int], at: int) -> None:
    """Each rank `lost` (killed or stalled in step `at`) keeps its stretch in the result, as
    the survivors rebuilt it under the worker it ran as: the steps it ran, each once, in
    order (the last one's time may still have been on its way when it was lost); its batch
    at each the plan's, with which the others' make the global batch."""
    assert sorted(r.rank for r in result.lost) == lost and result.departed == []
    for gone in result.lost:
        steps = [rec.step for rec in gone.records]
        assert steps == list(range(len(steps))) and at - 1 <= len(steps) <= at, steps
        assert gone.worker == f"w{gone.rank}"
    upto = min(len(r.records) for r in result.lost)
    for step in range(upto):
        batches = [r.records[step].batch for r in (*result.ranks, *result.lost)]
        assert sum(batches) == GLOBAL


@pytest.mark.slow
@pytest.mark.timeout(240)
def test_a_worker_killed_mid_step_leaves_the_others_running(local_digits, tmp_path):
    spec = _spec(local_digits, tmp_path / "killed", inject=[(2, 12, "kill")])
    raw, _ = run_workers(spec, timeout_s=200)
    result = RunResult.model_validate(raw)
    _survived(result, lost=[2], at=12)
    m = summarize(result, GLOBAL, None)
    assert m.steps == STEPS and m.restarts == 0 and m.steps_redone == 0
    assert result.ranks[0].evals[-1].step == STEPS
    # its steps kept: its type's entry (w2 is the only speed-2) and its row in the timeline
    _kept(result, lost=[2], at=12)
    (gone,) = result.lost
    entries = learned_entries(spec.cluster, spec.train, result, "20260101T000000000000Z")
    paces = {e.key.kind: e.rank for e in entries}
    assert paces["speed-2"].worker == "w2"
    assert paces["speed-2"].compute_batches  # fitted on its steps
    labels = rank_rows(result, spec.cluster)[1]
    assert labels[-1] == f"w2 · 2x (lost after step {gone.records[-1].step})"


@pytest.mark.slow
@pytest.mark.timeout(240)
def test_rank_0_lost_hands_its_part_to_the_lowest_rank_left(local_digits, tmp_path):
    spec = _spec(local_digits, tmp_path / "zero", inject=[(0, 13, "kill")])
    raw, _ = run_workers(spec, timeout_s=200)
    result = RunResult.model_validate(raw)
    _survived(result, lost=[0], at=13)
    _kept(result, lost=[0], at=13)  # rebuilt by rank 1, the leader after it
    assert result.lead.rank == 1  # it wrote the result, evaluated and checkpointed
    assert [e.step for e in result.lead.evals] == [10, 20, 30]  # 10: from rank 0's checkpoint
    assert Path(spec.run_dir, "model.pt").exists()
    assert CheckpointStore(str(Path(spec.run_dir) / "checkpoints")).load()["step"] == STEPS


@pytest.mark.slow
@pytest.mark.timeout(240)
def test_two_workers_lost_at_once(local_digits, tmp_path):
    spec = _spec(local_digits, tmp_path / "two", inject=[(1, 9, "kill"), (2, 9, "kill")])
    raw, _ = run_workers(spec, timeout_s=200)
    result = RunResult.model_validate(raw)
    _survived(result, lost=[1, 2], at=9)
    _kept(result, lost=[1, 2], at=9)


@pytest.mark.slow
@pytest.mark.timeout(240)
def test_a_stalled_worker_is_left_behind_and_killed(local_digits, tmp_path):
    spec = _spec(local_digits, tmp_path / "stalled", inject=[(3, 14, "stop")])
    raw, _ = run_workers(spec, timeout_s=200)
    result = RunResult.model_validate(raw)
    _survived(result, lost=[3], at=14)
    _kept(result, lost=[3], at=14)


@pytest.mark.slow
@pytest.mark.timeout(240)
def test_a_worker_sent_sigterm_leaves_at_the_next_boundary_alone(local_digits, tmp_path):
    spec = _spec(local_digits, tmp_path / "term", inject=[(1, 12, "term")])
    raw, _ = run_workers(spec, timeout_s=200)
    # signalled in step 12, it asks to leave at boundary 13 and leaves before step 14
    result = RunResult.model_validate(raw)
    _survived(result, lost=[1], at=14, in_flight="none")
    # the leaver's steps are kept; each rank is named as the worker it ran as
    (left,) = result.departed
    assert result.lost == []  # its own result, not one rebuilt by the others
    assert (left.rank, left.worker) == (1, "w1")
    assert [rec.step for rec in left.records] == list(range(14))
    assert [r.worker for r in result.ranks] == ["w0", "w2", "w3"]
    assert result.lead.recovery.membership[0].workers == {0: "w0", 2: "w2", 3: "w3"}
    # what the history stores and the timeline's rows name the right workers, not positions
    entries = learned_entries(spec.cluster, spec.train, result, "20260101T000000000000Z")
    assert {e.rank.worker: e.key.kind for e in entries} == {
        "w0": "speed-1",  # w1's kind too: the first rank of it gives it
        "w2": "speed-2",
        "w3": "speed-4",
    }
    assert rank_rows(result, spec.cluster)[1] == [
        "w0 · 1x",
        "w2 · 2x",
        "w3 · 4x",
        "w1 · 1x (left before step 14)",
    ]


@pytest.mark.slow
@pytest.mark.timeout(240)
def test_too_few_workers_left_end_the_job_with_a_checkpoint(local_digits, tmp_path):
    kills = [(r, 13, "kill") for r in (1, 2, 3)]
    spec = _spec(local_digits, tmp_path / "few", inject=kills, min_workers=2)
    with pytest.raises(RankFailed, match=r"1 worker\(s\) left, fewer than faults.min_workers 2"):
        run_workers(spec, timeout_s=200)
    saved = CheckpointStore(str(tmp_path / "few" / "checkpoints")).load()
    assert saved["step"] == 13  # the step the last worker reached, not the last interval's


@pytest.mark.slow
@pytest.mark.timeout(240)
def test_every_worker_lost_ends_the_job_naming_its_checkpoints(local_digits, tmp_path):
    spec = _spec(local_digits, tmp_path / "all", inject=[(r, 13, "kill") for r in range(4)])
    with pytest.raises(LaunchError, match="every worker of the job was lost"):
        run_workers(spec, timeout_s=200)
    assert CheckpointStore(str(Path(spec.run_dir) / "checkpoints")).load()["step"] == 10
