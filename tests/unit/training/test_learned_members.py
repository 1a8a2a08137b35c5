"""What a run's steps measured goes into the profile history under the worker each rank
actually was (`plan.learned.learned_entries`), after a leave or a join in place changed which
workers ran: never by the rank's position in the result (pure: constructed results)."""

from __future__ import annotations

import pytest

from hetflow.config import ClusterSpec, TrainConfig
from hetflow.records import PlanChange, RankResult, RunResult, StepRecord
from hetflow.training.plan.learned import learned_entries

STEPS, BATCH = 20, 16
# each worker's seconds per sample: distinct, so an entry shows whose steps it was fitted on
PACE = {"w0": 0.010, "w1": 0.009, "w2": 0.005, "w3": 0.0025}
CLUSTER = ClusterSpec.from_speeds([1, 1, 2, 4])  # kinds speed-1, speed-1, speed-2, speed-4
TRAIN = TrainConfig(recipe="digits-mlp", global_batch=64, steps=STEPS)


def ran(rank: int, worker: str, steps: range, pace: str | None = None) -> RankResult:
    """Rank `rank`, recorded as `worker`, computing `steps` at `pace`'s worker's seconds per
    sample (its own where not given)."""
    per = PACE[pace or worker]
    records = [
        StepRecord(
            step=s,
            batch=BATCH,
            data_s=0.0,
            compute_s=per * BATCH,
            wait_s=0.0,
            step_s=per * BATCH,
            loss_sum=0.0,
            bytes_sent=0.0,
        )
        for s in steps
    ]
    plans = [PlanChange(step=0, plan=[BATCH] * 4)]
    return RankResult(rank=rank, worker=worker, records=records, plans=plans, params=1000)


def by_worker(result: RunResult) -> dict[str, tuple[str, float]]:
    """worker -> (its entry's kind, its entry's seconds per sample)."""
    entries = learned_entries(CLUSTER, TRAIN, result, "20260101T000000000000Z")
    return {e.rank.worker: (e.key.kind, pytest.approx(e.rank.fit_s_per_sample)) for e in entries}


def test_after_a_leave_the_ranks_left_are_stored_as_their_own_workers():
    # rank 2 (w2, speed-2) left; w3 (speed-4) is second in the result, not w1
    result = RunResult(ranks=[ran(0, "w0", range(STEPS)), ran(3, "w3", range(STEPS))])
    assert by_worker(result) == {
        "w0": ("speed-1", PACE["w0"]),
        "w3": ("speed-4", PACE["w3"]),
    }


def test_a_worker_that_left_gets_the_entry_of_the_steps_it_ran_before_it_left():
    result = RunResult(
        ranks=[ran(0, "w0", range(STEPS)), ran(3, "w3", range(STEPS))],
        departed=[ran(2, "w2", range(12))],
    )
    assert by_worker(result)["w2"] == ("speed-2", PACE["w2"])


def test_a_worker_that_joined_gets_its_own_types_entry_from_its_steps():
    # w2 left at step 10; w3 (not in the launch) joined at 12 in slot 3, w1's leave made
    # rank 3 the third in the result
    result = RunResult(
        ranks=[ran(0, "w0", range(STEPS)), ran(3, "w3", range(12, STEPS))],
        departed=[ran(1, "w1", range(10)), ran(2, "w2", range(10))],
    )
    assert by_worker(result) == {
        "w0": ("speed-1", PACE["w0"]),
        "w3": ("speed-4", PACE["w3"]),
        "w2": ("speed-2", PACE["w2"]),
    }


def test_a_worker_added_under_another_name_is_stored_as_that_name_of_its_slots_type():
    # a worker the queue added into slot 2 (w2's: speed-2) under a name of its own
    result = RunResult(
        ranks=[ran(0, "w0", range(STEPS)), ran(2, "spare-7", range(8, STEPS), pace="w2")],
        departed=[ran(1, "w1", range(6))],
    )
    assert by_worker(result) == {
        "w0": ("speed-1", PACE["w0"]),  # w1's kind too: the first rank of it gives it
        "spare-7": ("speed-2", PACE["w2"]),
    }


def test_a_result_that_names_no_workers_maps_each_rank_to_its_slot():
    # results written before ranks named their worker: rank r ran as the cluster's worker r
    result = RunResult(ranks=[ran(0, "", range(STEPS), "w0"), ran(3, "", range(STEPS), "w3")])
    assert by_worker(result) == {
        "w0": ("speed-1", PACE["w0"]),
        "w3": ("speed-4", PACE["w3"]),
    }
