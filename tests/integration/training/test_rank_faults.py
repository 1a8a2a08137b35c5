"""A rank that raises, a NaN gradient, a stopped rank, a preempted worker: each ends as
docs/faults.md says, with real torchrun processes (2 ranks, a few steps). Each adds a row to
the fault table."""

from __future__ import annotations

import functools
import json
import os
import re
import signal
import threading
import time
from pathlib import Path

import pytest
import torch

from hetflow.config import ClusterSpec, TrackingConfig, TrainConfig
from hetflow.records import Plan, RunResult
from hetflow.training.launch.outcome import LaunchError, RankFailed
from hetflow.training.launch.run import run_workers
from hetflow.training.launch.spec import Injection, RunSpec
from hetflow.training.metrics import summarize

from tests.profiles import profile_of, rank_profile


# Tests that start torchrun: marked slow, each with a timeout.
def _launches(test):
    return pytest.mark.slow(pytest.mark.timeout(150)(test))


STEPS, EVERY = 16, 4


def _spec(dataset, run_dir: Path, inject=(), time_scale: float = 0, **train) -> RunSpec:
    """2 ranks; emulated `time_scale` times slower than a core (0: not emulated)."""
    knobs = {"recipe": "digits-mlp", "global_batch": 32, "steps": STEPS, "schedule": "equal"}
    knobs |= {"checkpoint_every": EVERY, "eval_every": 100, "target_accuracy": None, **train}
    return RunSpec(
        run_name=run_dir.name,
        variant="t",
        cluster=ClusterSpec.from_speeds([1, 1], emulate=time_scale > 0, time_scale=time_scale or 1),
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


@_launches
def test_a_raising_rank_fails_the_flow_and_its_mlflow_run_at_once_naming_rank_and_exception(
    digits, prefect_harness, monkeypatch, fault_table
):
    from mlflow import MlflowClient
    from prefect import flow

    import hetflow.tasks.train as train_task
    from hetflow.infra.tracking.tracker import MLflowTracker

    boom = Injection(rank=1, step=3, kind="raise")
    from hetflow.training.launch import run as run_module

    monkeypatch.setattr(run_module, "RunSpec", functools.partial(RunSpec, inject=[boom]))
    cluster = ClusterSpec.from_speeds([1, 1], emulate=False)
    cfg = TrainConfig(recipe="digits-mlp", global_batch=32, steps=STEPS, eval_every=100)
    profile = profile_of([rank_profile(0, 1e4), rank_profile(1, 1e4)], model="mlp")

    @flow(name="train-one")
    def train_one():
        return train_task.train_variant("boom", cluster, digits, cfg, profile, TrackingConfig())

    state = train_one(return_state=True)
    assert state.is_failed()
    assert "RankFailed: rank 1 (step 3): RuntimeError: injected fault at step 3" in state.message
    client: MlflowClient = MLflowTracker(TrackingConfig()).client
    experiment = client.get_experiment_by_name("hetflow").experiment_id
    (run,) = client.search_runs([experiment], filter_string="tags.variant = 'boom'")
    assert run.info.status == "FAILED"
    tags = run.data.tags
    assert (tags["failed_rank"], tags["failed_step"], tags["failure"]) == ("1", "3", "error")
    note = tags["mlflow.note.content"]
    assert "RuntimeError: injected fault at step 3" in note and "inject.py" in note  # last lines
    assert _task_run_counts(state.state_details.flow_run_id) == {"train boom": 1}  # no retry
    row = ("rank raises at step 3", "train task in a flow (2 ranks)", "failed at once")
    fault_table.append((*row, 0, "-", 1))


def _task_run_counts(flow_run_id) -> dict[str, int]:
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterId

    with get_client(sync_client=True) as client:
        runs = client.read_task_runs(
            flow_run_filter=FlowRunFilter(id=FlowRunFilterId(any_=[flow_run_id]))
        )
    return {r.name: r.run_count for r in runs if r.name.startswith("train")}


@_launches
def test_a_nan_gradient_fails_the_run_naming_the_step(digits, tmp_path, fault_table):
    spec = _spec(digits, tmp_path / "nan", [Injection(rank=1, step=6, kind="nan")])
    with pytest.raises(RankFailed) as e:
        run_workers(spec, timeout_s=120)
    assert e.value.failure.kind == "nonfinite"
    assert "step 6: the gradient is NaN/Inf" in str(e.value)
    fault_table.append(("NaN loss on one rank", "training, nonfinite=fail", "failed", 0, "-", 1))


@_launches
def test_a_nan_gradient_is_skipped_on_every_rank_alike(digits, tmp_path, fault_table):
    spec = _spec(
        digits, tmp_path / "skip", [Injection(rank=1, step=6, kind="nan")], nonfinite="skip"
    )
    result = RunResult.model_validate(run_workers(spec, timeout_s=120)[0])
    for rank in result.ranks:
        assert [r.step for r in rank.records if r.skipped] == [6]
    weights = torch.load(Path(spec.run_dir) / "model.pt")
    assert all(torch.isfinite(w).all() for w in weights.values())
    fault_table.append(
        ("NaN loss on one rank", "training, nonfinite=skip", "finished", 0, "1 step skipped", 1)
    )


@_launches
def test_a_stopped_rank_is_named_and_the_group_restarts_from_the_checkpoint(
    digits, tmp_path, fault_table, capsys
):
    run_dir = tmp_path / "stop"
    spec = _spec(digits, run_dir, time_scale=8, steps=24, stall_timeout_s=3)
    thread, outcome = _in_background(spec, timeout_s=120)
    _wait_for_step(run_dir, EVERY + 2, thread)
    os.kill(_rank_pid(run_dir, 1), signal.SIGSTOP)
    thread.join(timeout=120)
    assert "result" in outcome, outcome
    m = summarize(RunResult.model_validate(outcome["result"]), 32, None)
    assert m.steps == 24 and m.restarts >= 1
    assert "rank 1 stalled" in capsys.readouterr().out
    row = ("SIGSTOP of a rank", "training, stall 3 s", "rank named, restarted")
    fault_table.append((*row, m.steps_redone, "none", 1))


@_launches
def test_a_sigterm_checkpoints_at_the_next_step_and_redoes_at_most_one(
    digits, tmp_path, fault_table
):
    run_dir = tmp_path / "term"
    spec = _spec(digits, run_dir, time_scale=8, steps=24, checkpoint_every=100)
    thread, outcome = _in_background(spec, timeout_s=120)
    _wait_for_step(run_dir, 5, thread)
    os.kill(_rank_pid(run_dir, 1), signal.SIGTERM)
    thread.join(timeout=120)
    assert "result" in outcome, outcome
    m = summarize(RunResult.model_validate(outcome["result"]), 32, None)
    assert m.steps == 24
    assert m.restarts == 1 and m.steps_redone <= 1
    log = (run_dir / "workers.log").read_text()
    stops = re.findall(r"rank (\d): preempted \(SIGTERM\): checkpointed at step (\d+)", log)
    assert sorted(r for r, _ in stops) == ["0", "1"] and len({s for _, s in stops}) == 1
    row = ("SIGTERM of a worker", "training (2 ranks)", "checkpointed, restarted")
    fault_table.append((*row, m.steps_redone, "none", 1))


STUCK_RANK = """
import threading, sys
from hetflow.training import worker
from hetflow.training.faults.records import PREEMPTED_EXIT

def start(argv):  # a rank whose data thread hangs on a read, preempted: checkpointed, exits
    threading.Thread(target=threading.Event().wait).start()  # not a daemon: joined at teardown
    print("checkpointed", flush=True)
    raise SystemExit(PREEMPTED_EXIT)

worker.start = start
worker.{entry}
"""


@pytest.mark.parametrize("entry", ["main([])", "forked_main()"])
@pytest.mark.timeout(120)
def test_a_preempted_rank_exits_at_once_whatever_its_threads_wait_for(entry):
    """A preempted rank, its checkpoint written, ends with its exit code at once, not after
    its threads: a thread stuck on a read (an S3 request that never answers) held a forked
    rank at multiprocessing's teardown past the job's deadline (a full suite's SIGTERM
    test, torchrun 'ran past its deadline')."""
    import subprocess
    import sys

    from hetflow.training.faults.records import PREEMPTED_EXIT

    code = STUCK_RANK.replace("{entry}", entry)
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=90)
    assert done.returncode == PREEMPTED_EXIT and "checkpointed" in done.stdout
