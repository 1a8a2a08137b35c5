"""The queue's moves in place: a job that runs elastic (`QueueJob.in_place`) gives a worker to
another at a step boundary, or takes one into a spare slot, without a stop at a checkpoint or
a relaunch; its MLflow run shows the change of membership; a job that does not run elastic
still moves by relaunch."""

from __future__ import annotations

import json
from typing import ClassVar

import pytest

from hetflow.tasks import queue_moves
from hetflow.tasks.queue_moves import Moves
from hetflow.training.launch.live import registered


class FakeMembers:
    """A running elastic job's membership, its ranks' processes ending when told to."""

    def __init__(self, names: list[str]) -> None:
        self.names, self.released, self.ended = names, [], set()

    def release(self, rank: int) -> None:
        self.released.append(rank)

    def gone(self, rank: int) -> bool:
        return rank in self.ended

    def rank_of(self, worker: str) -> int | None:
        return self.names.index(worker) if worker in self.names else None

    def add(self, worker: str) -> int:
        if worker not in self.names:
            raise ValueError(f"no free slot fits worker {worker!r}")
        self.added = [*getattr(self, "added", []), worker]
        return self.names.index(worker)

    def joined(self, rank: int) -> bool:
        return rank in getattr(self, "admitted", set())


def test_a_shrink_releases_the_workers_given_up_and_frees_them_once_gone(tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    (run / "progress.json").write_text(json.dumps({"step": 5}))
    members = FakeMembers(["w0", "w1", "w2"])
    moves = Moves(default_s=2.0)
    with registered(run, members):
        assert not moves.shrink("a", tmp_path / "other", ["w0", "w1"], ["w0"], 0.0)  # not live
        assert members.released == []
        assert moves.shrink("a", run, ["w0", "w1", "w2", "w3"], ["w1"], 10.0)
        assert members.released == [0, 2]  # w3: dropped by the plan, no rank to release
        assert moves.busy() == {"w0", "w2", "w3"}
        assert [m.worker for m in moves.settle(10.5)] == ["w3"]  # free at once
        assert moves.busy() == {"w0", "w2"}
        members.ended |= {0, 2}
        assert {m.worker for m in moves.settle(11.0)} == {"w0", "w2"}
        assert moves.busy() == set() and moves.cost_s == 2.0  # not stepping again yet
        (run / "progress.json").write_text(json.dumps({"step": 6}))
        moves.settle(11.5)
    assert moves.leaving == [] and moves.cost_s == 1.5  # request to the job stepping again
    assert moves.count("a") == 3


def test_a_job_not_stepping_yet_is_not_shrunk_in_place(tmp_path):
    members = FakeMembers(["w0", "w1"])
    with registered(tmp_path, members):
        assert not Moves(1.0).shrink("a", tmp_path, ["w0", "w1"], ["w0"], 0.0)
    assert members.released == []


def test_the_plan_plot_draws_a_rank_that_left_at_zero_after_its_leave(tmp_path):
    """A run under `on_loss: continue` that a rank left: its steps' rows hold fewer ranks from
    the leave on; the plot of the plan draws every rank, the one that left at 0 after it."""
    from hetflow.figures import StepFigures, StepRank
    from hetflow.infra.report.plots import step_series

    def row(step: int, batches: dict[int, int]) -> StepFigures:
        ranks = [StepRank(rank=r, busy_fraction=0.5, local_batch=b) for r, b in batches.items()]
        return StepFigures(step=step, loss=1.0, step_time_s=0.1, ranks=ranks)

    series = [row(0, {0: 16, 1: 16}), row(1, {0: 16, 1: 16}), row(2, {1: 32})]
    path = step_series(series, tmp_path / "steps.png", labels=["w0", "w1"])
    assert path.stat().st_size > 0


def record(step: int, batch: int, step_s: float):
    """A rank's step record of `step_s` seconds, 0.05 of them computing, a loss of 1 a
    sample."""
    from hetflow.records import StepRecord

    return StepRecord(
        step=step,
        batch=batch,
        data_s=0.0,
        compute_s=0.05,
        wait_s=step_s - 0.05,
        step_s=step_s,
        loss_sum=float(batch),
        bytes_sent=0.0,
    )


def test_the_step_series_of_ranks_with_uneven_records_is_read_by_step():
    """A run whose ranks' records differ in length (a rank that came or went in place): each
    step's row holds the ranks that ran it, its loss over their samples."""
    from hetflow.records import RankResult, RunResult
    from hetflow.training.metrics import step_series

    def rec(step: int, batch: int):
        return record(step, batch, step_s=0.1)

    lead = RankResult(rank=0, records=[rec(s, 16 if s < 2 else 32) for s in range(4)], plans=[])
    other = RankResult(rank=1, records=[rec(s, 16) for s in range(2)], plans=[])
    rows = step_series(RunResult(ranks=[lead, other]), 32)
    assert [[r.rank for r in row.ranks] for row in rows] == [[0, 1], [0, 1], [0], [0]]
    assert [row.loss for row in rows] == [1.0] * 4


def test_a_run_whose_lead_joined_in_place_counts_the_steps_before_its_join():
    """Rank 0 ran steps 0-2 and left in place at 3; rank 1 joined at 2 and wrote the result
    (a job moved wholly to another worker): the run made 6 steps, its training loop is all
    six, and its step series holds each step once, steps 0-1 from rank 0's records."""
    from hetflow.records import RankResult, RunResult
    from hetflow.training.metrics import step_records, step_series, summarize

    def rec(step: int, batch: int):
        return record(step, batch, step_s=0.1 + step)

    joiner = RankResult(
        rank=1, records=[rec(s, 16 if s < 3 else 32) for s in range(2, 6)], plans=[]
    )
    left = RankResult(rank=0, records=[rec(s, 32 if s < 2 else 16) for s in range(3)], plans=[])
    result = RunResult(ranks=[joiner], departed=[left])
    assert [r.step for r in step_records(result)] == list(range(6))
    metrics = summarize(result, 32)
    assert metrics.steps == 6
    assert metrics.train_loop_s == pytest.approx(sum(0.1 + s for s in range(6)))
    rows = step_series(result, 32)
    assert [row.step for row in rows] == list(range(6))
    assert [[r.rank for r in row.ranks] for row in rows] == [[0], [0], [0, 1], [1], [1], [1]]
    assert [row.loss for row in rows] == [1.0] * 6


def test_a_grow_starts_each_free_worker_in_its_slot_and_times_its_join(tmp_path, monkeypatch):
    """Each worker added holds its Prefect slot for the job (the limit is outside the claim:
    recorded), is started in its slot, and a worker with no slot is not added (its slot
    given back); the move that freed a worker names the job that took it in place, and its
    taker's time runs to the job stepping past the step it had when the worker was in."""
    held, freed = [], []
    monkeypatch.setattr(queue_moves, "hold_slot", lambda *a, **k: held.append(a[:3]))
    monkeypatch.setattr(queue_moves, "free_slot", lambda job, w: freed.append((job, w)))
    giver, taker = tmp_path / "giver", tmp_path / "taker"
    for run in (giver, taker):
        run.mkdir()
        (run / "progress.json").write_text(json.dumps({"step": 5}))
    a, b = FakeMembers(["w0", "w1"]), FakeMembers(["w0", "w2"])
    moves = Moves(default_s=1.0)
    with registered(giver, a), registered(taker, b):
        assert moves.shrink("a", giver, ["w0", "w1"], ["w0"], 0.0)
        a.ended.add(1)
        moves.settle(0.5)  # w1 free
        assert moves.grow("b", tmp_path / "none", ["w1"], {"w1": "k"}, 1.0) is None  # not live
        limits = {"w2": "k", "w1": "k"}
        assert moves.grow("b", taker, ["w2", "w1"], limits, 1.0) == ["w2"]
        assert held == [("b", "w1", "k"), ("b", "w2", "k")] and freed[-1] == ("b", "w1")
        assert b.added == ["w2"] and moves.grown("b") == 1 and moves.watching()
        moves.watch(1.5)
        b.admitted = {1}  # in a generation, at step 5
        moves.watch(2.0)
        (taker / "progress.json").write_text(json.dumps({"step": 6}))
        moves.watch(3.0)
    (grow,) = [m for m in moves.figures() if m["to"] == "b"]
    assert grow == {
        "job": None,
        "worker": "w2",
        "to": "b",
        "step": 5,
        "free_s": None,
        "giver_s": None,
        "taker_s": 2.0,
        "grown": True,
    }


def test_a_worker_freed_in_place_and_grown_onto_carries_both_sides(tmp_path, monkeypatch):
    monkeypatch.setattr(queue_moves, "hold_slot", lambda *a, **k: None)
    giver, taker = tmp_path / "giver", tmp_path / "taker"
    for run in (giver, taker):
        run.mkdir()
        (run / "progress.json").write_text(json.dumps({"step": 5}))
    a, b = FakeMembers(["w0", "w1"]), FakeMembers(["w1", "w2"])
    moves = Moves(default_s=1.0)
    with registered(giver, a), registered(taker, b):
        moves.shrink("a", giver, ["w0", "w1"], ["w0"], 0.0)
        a.ended.add(1)
        moves.settle(0.5)
        (giver / "progress.json").write_text(json.dumps({"step": 6}))
        moves.settle(1.0)
        assert moves.grow("b", taker, ["w1"], {"w1": "k"}, 1.0) == ["w1"]
        b.admitted = {0}
        moves.watch(1.5)
        (taker / "progress.json").write_text(json.dumps({"step": 7}))
        moves.watch(4.0)
    (move,) = moves.figures()
    assert move["job"] == "a" and move["to"] == "b" and move["grown"]
    assert (move["free_s"], move["giver_s"], move["taker_s"]) == (0.5, 1.0, 4.0)


class FakeHold:
    """A Prefect slot held (the limit is outside the claim: each acquire recorded)."""

    made: ClassVar[list[FakeHold]] = []

    def __init__(self, limit: str, timeout_s: float) -> None:
        self.limit, self.released = limit, False
        FakeHold.made.append(self)

    def release(self) -> None:
        self.released = True


def test_a_worker_that_leaves_in_place_hands_its_slot_to_the_job_that_takes_it(monkeypatch):
    """The slot of a worker that left a job in place stays held, and the job that takes the
    worker next (launched on it, or grown onto it) holds that one: no second acquire. One no
    job is bound for is given back."""
    FakeHold.made = []
    monkeypatch.setattr(queue_moves, "SlotHold", FakeHold)
    queue_moves.hold_slots("a", {"w0": "k0", "w1": "k1"}, 1.0)
    w0, w1 = sorted(FakeHold.made, key=lambda h: h.limit)
    queue_moves.park_slot("a", "w1")  # w1 left `a` in place
    queue_moves.release_parked({"w1"})  # `b` is bound for it: kept
    queue_moves.hold_slots("b", {"w1": "k1", "w2": "k1"}, 1.0)
    assert len(FakeHold.made) == 3 and not w1.released  # w2's acquired, w1's handed over
    queue_moves.park_slot("b", "w1")
    queue_moves.hold_slot("c", "w1", "k1", 1.0)  # grown onto in place: handed over too
    assert len(FakeHold.made) == 3 and not w1.released
    queue_moves.park_slot("c", "w1")
    queue_moves.release_parked({"w0"})  # no job is bound for w1: given back
    assert w1.released and not w0.released
    queue_moves.hold_slot("c", "w1", "k1", 1.0)
    assert len(FakeHold.made) == 4  # acquired afresh
    for job in "abc":
        queue_moves.free_slots(job)
    assert all(h.released for h in FakeHold.made)
