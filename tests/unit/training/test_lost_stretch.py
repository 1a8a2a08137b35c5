"""A worker lost in place (killed, stalled) under `faults.on_loss: continue` keeps its steps in
the run's result: the survivors rebuild its stretch from the step times shared with them
(`training.elastic.lost`), which the profile history and the per-rank timeline then read
(pure: constructed rows and results; the run on real processes is in
tests/integration/training/test_elastic.py)."""

from __future__ import annotations

import pytest
import torch

from hetflow.config import ClusterSpec, TrainConfig
from hetflow.infra.report.plots import rank_rows
from hetflow.records import MembershipChange, PlanChange, RankResult, RunResult, StepRecord
from hetflow.training.elastic.lost import LostStretches, lost_records
from hetflow.training.loop.compute_times import SharedStepTimes
from hetflow.training.plan.learned import learned_entries

STEPS = 20
PACE = [0.010, 0.010, 0.005, 0.0025]  # seconds per sample of w0..w3
CLUSTER = ClusterSpec.from_speeds([1, 1, 2, 4])  # speed-2 (w2) is the only one of its kind
TRAIN = TrainConfig(recipe="digits-mlp", global_batch=64, steps=STEPS)
# the plan changes at step 8: rank 2's batch goes from 16 to 24
PLANS = [PlanChange(step=0, plan=[16, 16, 16, 16]), PlanChange(step=8, plan=[12, 12, 24, 16])]


def rows(upto: int) -> dict[int, list[float]]:
    """Every rank's compute time of steps 0..upto-1 as the shared rows hold them."""
    return {s: [p * plan_of(s)[r] for r, p in enumerate(PACE)] for s in range(upto)}


def plan_of(step: int) -> list[int]:
    return (PLANS[1] if step >= 8 else PLANS[0]).plan


def own(rank: int, worker: str, steps: range) -> RankResult:
    """A rank that ran to the end, with its own records."""
    records = [
        StepRecord(
            step=s,
            batch=plan_of(s)[rank],
            data_s=0.0,
            compute_s=PACE[rank] * plan_of(s)[rank],
            wait_s=0.0,
            step_s=0.0,
            loss_sum=0.0,
            bytes_sent=0.0,
        )
        for s in steps
    ]
    return RankResult(rank=rank, worker=worker, records=records, plans=PLANS, params=1000)


def test_a_lost_ranks_steps_are_rebuilt_from_the_shared_rows_once_each_in_order():
    shared = rows(13)
    shuffled = {s: shared[s] for s in reversed(range(13))}  # kept in the order they came in
    recs = lost_records(2, shuffled, PLANS)
    assert [r.step for r in recs] == list(range(13))
    assert [r.batch for r in recs] == [16] * 8 + [24] * 5  # the plan in force at each step
    assert [r.compute_s for r in recs] == pytest.approx([PACE[2] * r.batch for r in recs])
    # it waited for the slowest rank (w0 or w1) each step
    slowest = [max(row) for _, row in sorted(shared.items())]
    assert [r.idle_s for r in recs] == pytest.approx(
        [m - r.compute_s for m, r in zip(slowest, recs, strict=True)]
    )
    assert all(r.data_s == 0 and r.bytes_sent == 0 for r in recs)  # not known to the others


def test_a_rank_that_joined_is_rebuilt_from_its_join_on_and_split_under_its_cap():
    recs = lost_records(2, rows(13), PLANS, since=5, cap=16)
    assert [r.step for r in recs] == list(range(5, 13))
    assert [r.micro_batches for r in recs] == [1] * 3 + [2] * 5  # 24 past a cap of 16


class _World:
    members = (0, 1, 2, 3)

    def worker_of(self, rank: int) -> str:
        return f"w{rank}"


class _Store:
    def __init__(self) -> None:
        self.keys: dict[str, object] = {}

    def add(self, key: str, n: int) -> int:
        self.keys[key] = int(self.keys.get(key, 0)) + n
        return self.keys[key]

    def set(self, key: str, value: str) -> None:
        self.keys[key] = value


def test_the_leader_stores_a_lost_ranks_stretch_under_the_worker_it_ran_as():
    shared = SharedStepTimes(4, None, 1)
    kept = LostStretches(_World(), shared, 0, None)
    assert shared.kept is kept.rows  # every collected row lands there
    kept.rows.update(rows(12))
    # a replacement joined slot 1 at step 6 under another name, then was lost too
    kept.follow(
        MembershipChange(
            step=6,
            lost=[],
            world=4,
            step_in_flight="none",
            regroup_s=0,
            plan=[16] * 4,
            joined=[1],
            workers={1: "spare"},
        )
    )
    store = _Store()
    out = kept.publish(store, [2, 1, 3], PLANS, params=1000)
    assert [(r.rank, r.worker, r.records[0].step) for r in out] == [
        (2, "w2", 0),
        (1, "spare", 6),
        (3, "w3", 0),
    ]
    assert store.keys["lost"] == 3
    assert RankResult.model_validate_json(store.keys["lost/0"]).worker == "w2"


def test_a_lost_worker_gets_the_learned_entry_of_its_type_and_a_row_in_the_timeline():
    # w2 (speed-2, the only one of its kind) was killed in step 13: its rows up to step 12
    lost = RankResult(
        rank=2, worker="w2", records=lost_records(2, rows(13), PLANS), plans=PLANS, params=1000
    )
    result = RunResult(
        ranks=[own(0, "w0", range(STEPS)), own(1, "w1", range(STEPS)), own(3, "w3", range(STEPS))],
        lost=[lost],
    )
    entries = learned_entries(CLUSTER, TRAIN, result, "20260101T000000000000Z")
    by_kind = {e.key.kind: e.rank for e in entries}
    assert by_kind["speed-2"].worker == "w2"
    assert by_kind["speed-2"].fit_s_per_sample == pytest.approx(PACE[2])
    assert result.stretches[-1] is lost and result.departed == []
    assert rank_rows(result, CLUSTER)[1] == [
        "w0 · 1x",
        "w1 · 1x",
        "w3 · 4x",
        "w2 · 2x (lost after step 12)",
    ]


class _Work:
    def __init__(self, done: bool, fails: bool = False) -> None:
        self.done, self.fails = done, fails

    def is_completed(self) -> bool:
        return self.done

    def wait(self) -> None:
        if self.fails:
            raise RuntimeError("Connection closed by peer")


def _gather(step: int, work: _Work):
    rec = StepRecord(
        step=step,
        batch=8,
        data_s=0,
        compute_s=0.1,
        wait_s=0.3,
        step_s=0.4,
        loss_sum=0,
        bytes_sent=0,
    )
    out = [torch.tensor([0.1 * (r + 1)], dtype=torch.float64) for r in range(2)]
    return ([(rec, 1)], out, work)


def test_dropping_the_gathers_in_flight_keeps_the_rows_already_in():
    shared = SharedStepTimes(2, None, 1)
    shared.kept = {}
    shared.unsent = [(_gather(9, _Work(True))[0][0][0], 1)]
    shared.pending = [
        _gather(6, _Work(True, fails=True)),  # the lost peer's part never came
        _gather(7, _Work(True)),  # in on this rank before the loss
        _gather(8, _Work(False)),  # still waiting on the lost peer
    ]
    done = shared.drop()
    assert [rec.step for rec, _, _ in done] == [7]
    assert shared.kept == {7: pytest.approx([0.1, 0.2])}
    assert shared.pending == [] and shared.unsent == []
