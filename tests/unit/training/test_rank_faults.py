"""What the launcher reads of its ranks' failure records (the root cause, the rank that did
not answer a timed-out collective), and a failure policy refused where it cannot hold."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from hetflow.config import ClusterSpec, TrainConfig
from hetflow.training.faults.records import RankFailure, ranks_dir
from hetflow.training.faults.watch import JobWatch


def test_the_first_failure_of_a_rank_own_is_the_root_cause(tmp_path):
    watch = JobWatch(tmp_path, stall_timeout_s=2)
    _record(tmp_path, rank=0, kind="peer_lost", at=3.0)
    assert watch.fatal() is None  # torchrun restarts the group for a lost peer
    _record(tmp_path, rank=1, kind="error", at=2.0)
    _record(tmp_path, rank=2, kind="error", at=4.0)
    assert watch.fatal().rank == 1


def test_the_rank_that_did_not_answer_a_timed_out_collective_is_named(tmp_path):
    watch = JobWatch(tmp_path, stall_timeout_s=2)
    ranks_dir(tmp_path, 0).mkdir(parents=True)
    for rank in (0, 1, 2):
        (ranks_dir(tmp_path, 0) / f"rank{rank}.pid").write_text(str(10**7 + rank))
    _record(tmp_path, rank=0, kind="timed_out", at=time.time())
    assert watch.stalled(set()) == []  # the others may still be timing out
    _record(tmp_path, rank=2, kind="timed_out", at=time.time() - 5)
    (line,) = watch.stalled(set())
    assert line.startswith("rank 1 stalled at step 7: no answer in a collective for 2 s")
    assert watch.stalled(set()) == [] and watch.stalls == [line]  # named once


def _record(run_dir: Path, rank: int, kind: str, at: float) -> None:
    folder = ranks_dir(run_dir, 0)
    folder.mkdir(parents=True, exist_ok=True)
    failure = RankFailure(
        rank=rank, kind=kind, step=7, exception="RuntimeError", message="m", time=at
    )
    (folder / f"rank{rank}.failure.json").write_text(failure.model_dump_json())


def test_skipping_nonfinite_steps_is_refused_where_the_gradient_is_not_all_reduced_every_step():
    from hetflow.config import ConfigError, check_job

    cfg = TrainConfig(nonfinite="skip", compression="localsgd:4")
    with pytest.raises(ConfigError, match=r"^train\.nonfinite: 'skip' needs"):
        check_job(ClusterSpec.from_speeds([1, 1]), cfg)
