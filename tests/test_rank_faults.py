"""A rank that raises, a NaN gradient, a stopped rank, a preempted worker: each ends as issue 23
says, with real torchrun processes (2 ranks, a few steps). Each adds a row to the fault table."""

from __future__ import annotations

import json
import os
import signal
import threading
import time
from pathlib import Path

import pytest
import torch

from hetflow.config import ClusterSpec, TrainConfig
from hetflow.records import Plan, RunResult
from hetflow.training.job import Injection, RunSpec
from hetflow.training.launch import LaunchError, RankFailed, run_workers
from hetflow.training.metrics import summarize

pytestmark = [pytest.mark.slow, pytest.mark.timeout(150)]

STEPS, EVERY = 16, 4


def _spec(dataset, run_dir: Path, inject=(), **train) -> RunSpec:
    knobs = {"model": "mlp", "global_batch": 32, "steps": STEPS, "schedule": "equal"}
    knobs |= {"checkpoint_every": EVERY, "eval_every": 100, "target_accuracy": None, **train}
    return RunSpec(
        run_name=run_dir.name,
        variant="t",
        cluster=ClusterSpec.from_speeds([1, 1], emulate=False),
        dataset=dataset,
        train=TrainConfig(**knobs),
        plan=Plan.equal([16, 16]),
        inject=list(inject),
        run_dir=str(run_dir),
    )


def _progress(run_dir: Path) -> int:
    try:
        return json.loads((run_dir / "progress.json").read_text())["step"]
    except (FileNotFoundError, ValueError):
        return 0


def _rank_pid(run_dir: Path, rank: int) -> int:
    return int((run_dir / "ranks" / "attempt-0" / f"rank{rank}.pid").read_text())


def _in_background(spec: RunSpec, timeout_s: float) -> tuple[threading.Thread, dict]:
    outcome: dict = {}

    def target() -> None:
        try:
            outcome["result"] = run_workers(spec, timeout_s=timeout_s)[0]
        except LaunchError as e:
            outcome["error"] = e

    thread = threading.Thread(target=target)
    thread.start()
    return thread, outcome


def _wait_for_step(run_dir: Path, step: int, thread: threading.Thread) -> None:
    deadline = time.monotonic() + 90
    while _progress(run_dir) < step:
        assert time.monotonic() < deadline and thread.is_alive(), "training never got going"
        time.sleep(0.05)


def test_a_rank_that_raises_ends_the_job_at_once_naming_rank_and_step(
    digits, tmp_path, fault_table
):
    spec = _spec(digits, tmp_path / "raise", [Injection(rank=1, step=5, kind="raise")])
    with pytest.raises(RankFailed) as e:
        run_workers(spec, timeout_s=120)
    failure = e.value.failure
    assert (failure.rank, failure.step, failure.kind) == (1, 5, "error")
    assert "rank 1 (step 5): RuntimeError: injected fault at step 5" in str(e.value)
    assert any("faults.py" in line for line in failure.traceback)  # the last lines, too
    # ended, not restarted: no attempt after the first
    assert [p.name for p in (tmp_path / "raise" / "ranks").iterdir()] == ["attempt-0"]
    fault_table.append(("rank raises at step 5", "training (2 ranks)", "failed at once", 0, "-", 1))


def test_a_nan_gradient_fails_the_run_naming_the_step(digits, tmp_path, fault_table):
    spec = _spec(digits, tmp_path / "nan", [Injection(rank=1, step=6, kind="nan")])
    with pytest.raises(RankFailed) as e:
        run_workers(spec, timeout_s=120)
    assert e.value.failure.kind == "nonfinite"
    assert "step 6: the gradient is NaN/Inf" in str(e.value)
    fault_table.append(("NaN loss on one rank", "training, nonfinite=fail", "failed", 0, "-", 1))


def test_a_nan_gradient_is_skipped_on_every_rank_alike(digits, tmp_path, fault_table):
    spec = _spec(
        digits, tmp_path / "skip", [Injection(rank=1, step=6, kind="nan")], nonfinite="skip"
    )
    result = RunResult.model_validate(run_workers(spec, timeout_s=120)[0])
    for rank in result.ranks:
        assert [r.step for r in rank.records if r.skipped] == [6]
    weights = torch.load(Path(spec.run_dir) / "model.pt")
    assert all(torch.isfinite(w).all() for w in weights.values())
    fault_table.append(("NaN loss on one rank", "training, nonfinite=skip", "finished", 0, "1 step", 1))


def test_a_stopped_rank_is_named_and_the_group_restarts_from_the_checkpoint(
    digits, tmp_path, fault_table, capsys
):
    run_dir = tmp_path / "stop"
    spec = _spec(digits, run_dir, steps=24, stall_timeout_s=3)
    thread, outcome = _in_background(spec, timeout_s=120)
    _wait_for_step(run_dir, EVERY + 2, thread)
    os.kill(_rank_pid(run_dir, 1), signal.SIGSTOP)
    thread.join(timeout=120)
    assert "result" in outcome, outcome
    m = summarize(RunResult.model_validate(outcome["result"]), 32, None)
    assert m["steps"] == 24 and m["restarts"] >= 1
    assert "rank 1 stalled" in capsys.readouterr().out
    fault_table.append(
        ("SIGSTOP of a rank", "training, stall 3 s", "rank named, restarted", m["steps_redone"], "none", 1)
    )


def test_a_sigterm_checkpoints_at_the_next_step_and_redoes_at_most_one(
    digits, tmp_path, fault_table
):
    run_dir = tmp_path / "term"
    spec = _spec(digits, run_dir, steps=24, checkpoint_every=100)
    thread, outcome = _in_background(spec, timeout_s=120)
    _wait_for_step(run_dir, 5, thread)
    os.kill(_rank_pid(run_dir, 1), signal.SIGTERM)
    thread.join(timeout=120)
    assert "result" in outcome, outcome
    m = summarize(RunResult.model_validate(outcome["result"]), 32, None)
    assert m["steps"] == 24
    assert m["restarts"] == 1 and m["steps_redone"] <= 1
    fault_table.append(
        ("SIGTERM of a worker", "training (2 ranks)", "checkpointed, restarted", m["steps_redone"], "none", 1)
    )
