"""A worker killed with SIGKILL mid-training: torchrun restarts the group, training resumes
from the last checkpoint (the lr's warm-up where it was), finishes every step, and ends where
an uninterrupted run ends."""

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
from hetflow.training.launch.run import run_workers
from hetflow.training.launch.spec import RunSpec
from hetflow.training.loop.checkpoint_store import CheckpointStore
from hetflow.training.metrics import summarize

from tests.procs import pids_with

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]

STEPS, EVERY = 40, 10


def _spec(dataset, run_dir: Path) -> RunSpec:
    run_dir.mkdir(parents=True)
    cluster = ClusterSpec.from_speeds([1, 1, 2, 4], time_scale=2.0)
    train = TrainConfig(
        recipe="digits-mlp",
        global_batch=64,
        steps=STEPS,
        schedule="proportional",
        checkpoint_every=EVERY,
        eval_every=10,
        # the lr warms up from 0.05 to 0.1 (64 / 32, linear) over 30 steps: the checkpoint
        # of step 10 is taken mid-warm-up, and a resume that restarted it would end elsewhere
        lr=0.05,
        lr_scaling="linear",
        lr_tuned_batch=32,
        lr_warmup_steps=30,
    )
    return RunSpec(
        run_name=run_dir.name,
        variant="t",
        cluster=cluster,
        dataset=dataset,
        train=train,
        plan=Plan.equal([8, 8, 16, 32]),
        run_dir=str(run_dir),
    )


def _worker_pids(job: Path) -> list[int]:
    return pids_with("hetflow.training.worker", str(job), excluding="torch.distributed.run")


def _kill_one(pids: list[int]) -> None:
    """SIGKILL the newest of `pids` still alive (one listed may have exited since: a helper
    process whose command line names the job; seen once as ProcessLookupError)."""
    for pid in reversed(pids):
        try:
            os.kill(pid, signal.SIGKILL)
            return
        except ProcessLookupError:
            continue
    pytest.fail(f"no worker of {pids} was alive to kill")


def _progress(run_dir: Path) -> int:
    try:
        return json.loads((run_dir / "progress.json").read_text())["step"]
    except (FileNotFoundError, json.JSONDecodeError):
        return 0


def test_sigkilled_worker_resumes_from_checkpoint_and_finishes(digits, tmp_path, fault_table):
    reference = _spec(digits, tmp_path / "reference")
    run_workers(reference, timeout_s=240)

    spec = _spec(digits, tmp_path / "killed")
    outcome: dict = {}
    thread = threading.Thread(
        target=lambda: outcome.update(result=run_workers(spec, timeout_s=240)[0])
    )
    thread.start()
    deadline = time.monotonic() + 180
    while _progress(Path(spec.run_dir)) < EVERY + 3:  # past the first checkpoint
        assert time.monotonic() < deadline and thread.is_alive(), "training never got going"
        time.sleep(0.05)
    _kill_one(_worker_pids(Path(spec.run_dir) / "job.json"))
    thread.join(timeout=240)

    m = summarize(RunResult.model_validate(outcome["result"]), 64, None)
    assert m.steps == STEPS
    assert m.restarts >= 1
    assert 1 <= m.steps_redone <= EVERY
    got = torch.load(Path(spec.run_dir) / "model.pt")
    want = torch.load(Path(reference.run_dir) / "model.pt")
    for k in want:
        torch.testing.assert_close(got[k], want[k], atol=1e-5, rtol=0)
    fault_table.append(
        (
            "SIGKILL of a worker mid-run",
            "training (4 ranks)",
            f"finished, {m.restarts} restart(s)",
            m.steps_redone,
            "none (same final weights)",
            1,
        )
    )


def test_corrupt_latest_checkpoint_falls_back_to_the_previous_one(tmp_path):
    store = CheckpointStore(str(tmp_path / "ck"))
    store.save(10, {"step": 10, "w": torch.ones(3)})
    store.save(20, {"step": 20, "w": torch.full((3,), 2.0)})
    (tmp_path / "ck" / "ckpt-000020.pt").write_bytes(b"truncated")
    assert store.load()["step"] == 10
    store.save(30, {"step": 30, "w": torch.zeros(3)})
    assert store.load()["step"] == 30
    assert sorted(p.name for p in (tmp_path / "ck").glob("ckpt-*")) == [
        "ckpt-000020.pt",
        "ckpt-000030.pt",
    ]


def test_checkpoints_round_trip_through_s3(s3):
    store = CheckpointStore("s3://hetflow-ckpt/run1")
    store.fs.mkdir("hetflow-ckpt")
    store.save(5, {"step": 5, "w": torch.arange(4.0)})
    again = CheckpointStore("s3://hetflow-ckpt/run1").load()
    assert again["step"] == 5 and torch.equal(again["w"], torch.arange(4.0))
