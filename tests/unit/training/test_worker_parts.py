"""The torchrun worker's pure parts: straggler factors, the loop's state and its checkpoint,
the shared step times' batching, progress.json and the recovery note."""

from __future__ import annotations

import io
import json

import torch
import torch.distributed as dist

from hetflow.emulation.device_model import straggler_factor
from hetflow.emulation.emulator import Emulator
from hetflow.emulation.link import Link
from hetflow.records import EvalPoint, PlanChange, Recovery, StepRecord
from hetflow.training.loop.compute_times import SharedStepTimes, column_means
from hetflow.training.loop.progress import ProgressFile, note_recovery
from hetflow.training.loop.state import SETTLE_STEPS, SUDDEN_ROWS, Checkpoint, LoopState


def _rec(step: int, compute_s: float = 0.02, wait_s: float = 0.005) -> StepRecord:
    return StepRecord(
        step=step,
        batch=8,
        data_s=0.001,
        compute_s=compute_s,
        wait_s=wait_s,
        step_s=0.001 + compute_s + wait_s,
        loss_sum=1.5,
        bytes_sent=100.0,
    )


def test_straggler_factor_is_the_last_listed_onset_reached_for_that_rank():
    stragglers = [(3, 12, 4.0), (0, 5, 2.0), (0, 10, 3.0), (0, 8, 1.5)]
    assert straggler_factor(stragglers, 3, 11) == 1.0
    assert straggler_factor(stragglers, 3, 12) == 4.0
    assert straggler_factor(stragglers, 1, 100) == 1.0
    assert straggler_factor(stragglers, 0, 7) == 2.0
    # listed order decides, not the onsets' order: (0, 8) comes after (0, 10)
    assert straggler_factor(stragglers, 0, 9) == 1.5
    assert straggler_factor(stragglers, 0, 11) == 1.5
    assert straggler_factor([], 0, 0) == 1.0


def test_the_emulator_slows_a_straggler_at_each_step_from_its_own_slowdown():
    """`Emulator.at_step`, which the loop calls each step (the straggler hook the worker
    installs): the device's slowdown times this rank's factor at that step, never compounded."""
    stragglers = [(3, 12, 4.0), (0, 5, 2.0)]
    emu = Emulator(1.5, Link(None, 0.0), stragglers=stragglers, rank=0)
    slowdowns = []
    for step in (4, 5, 6, 0):
        emu.at_step(step)
        slowdowns.append(emu.slowdown)
    assert slowdowns == [1.5, 3.0, 3.0, 1.5]


def test_rows_are_kept_only_for_the_settled_steps_of_the_plan_in_force():
    state = LoopState.fresh([8, 8])
    tag = len(state.plans)
    for step in range(SETTLE_STEPS):
        state.add_row(tag, step, [1.0, 1.0])  # the plan's first steps: one-off costs
    assert state.current == [] and state.window == []
    state.add_row(tag, SETTLE_STEPS, [1.0, 2.0])
    assert state.current == [[1.0, 2.0]] and state.window == [[1.0, 2.0]]

    state.adopt([4, 12], step=10)
    assert state.plans[-1] == PlanChange(step=10, plan=[4, 12]) and state.plan == [4, 12]
    assert state.current == [] and state.window == []  # the old plan's rows pair other batches
    state.add_row(tag, 10 + SETTLE_STEPS, [9.0, 9.0])  # gathered late, run on the old plan
    assert state.current == []
    state.add_row(len(state.plans), 10 + SETTLE_STEPS - 1, [9.0, 9.0])  # the new plan, unsettled
    assert state.current == []
    for i in range(SUDDEN_ROWS + 3):
        state.add_row(len(state.plans), 10 + SETTLE_STEPS + i, [float(i), 0.0])
    assert len(state.current) == SUDDEN_ROWS and state.current[-1] == [SUDDEN_ROWS + 2.0, 0.0]
    assert state.window == [[float(i), 0.0] for i in range(SUDDEN_ROWS + 3)]  # read, then emptied


def test_loop_state_comes_back_from_a_checkpoint_as_it_was_saved():
    state = LoopState.fresh([8, 24])
    state.adopt([10, 22], step=4)
    state.evals.append(EvalPoint(step=5, train_time_s=1.25, accuracy=0.5))
    state.records.extend(_rec(s) for s in range(6))
    state.train_time_s = 1.5
    other_rank = [_rec(s, compute_s=0.04) for s in range(6)]
    ckpt = Checkpoint(
        step=6,
        workers=["w0", "w1"],
        model={"w": torch.ones(2)},
        optimizer={},
        plan=state.plan,
        plans=state.plans,
        evals=state.evals,
        train_time_s=state.train_time_s,
        rebalancer={},
        comm=None,
        trials=None,
        scaler={},
        records=[state.records, other_rank],
    )
    buf = io.BytesIO()
    torch.save(ckpt.to_dict(), buf)  # as CheckpointStore does: plain dicts and lists inside
    loaded = Checkpoint.from_dict(torch.load(io.BytesIO(buf.getvalue()), weights_only=True), [])

    again = LoopState.from_checkpoint(loaded, rank=0)
    assert (again.plan, again.plans, again.evals) == (state.plan, state.plans, state.evals)
    assert again.records == state.records and again.train_time_s == 1.5 and again.start == 6
    assert LoopState.from_checkpoint(loaded, rank=1).records[0].compute_s == 0.04
    assert loaded.workers == ["w0", "w1"] and loaded.model["w"].tolist() == [1.0, 1.0]


def test_step_times_go_out_every_k_posts_and_the_newest_gather_stays_in_flight(tmp_path):
    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'init'}", rank=0, world_size=1)
    try:
        shared = SharedStepTimes(1, None, every=2)
        recs = [_rec(s) for s in range(5)]
        for rec in recs[:4]:
            shared.post(rec, tag=1)
        got = shared.collect()  # two gathers sent: the older comes back
        assert [r.step for r, _, _ in got] == [0, 1]
        assert [row for _, _, row in got] == [[0.02], [0.02]]
        shared.post(recs[4], tag=2)  # unsent: one post of two
        got = shared.collect(flush=True)
        assert [(r.step, tag) for r, tag, _ in got] == [(2, 1), (3, 1), (4, 2)]
        assert shared.pending == [] and shared.unsent == []
        # alone, a rank waits for nobody: its whole wait is communication
        assert all(r.idle_s == 0.0 and r.comm_s == r.wait_s for r in recs)
    finally:
        dist.destroy_process_group()


def test_column_means_are_per_rank():
    assert column_means([[1.0, 4.0], [3.0, 8.0]]) == [2.0, 6.0]


def test_progress_file_holds_its_start_at_once_and_overwrites_an_older_longer_file(tmp_path):
    path = tmp_path / "progress.json"
    path.write_text(json.dumps({"step": 3, "note": "x" * 100}))
    progress = ProgressFile(path, start=40)
    assert json.loads(path.read_text()) == {"step": 40}
    progress.write(12345)
    size = path.stat().st_size
    progress.write(41)
    assert json.loads(path.read_text()) == {"step": 41} and path.stat().st_size == size


def test_recovery_note_counts_restarts_and_the_steps_past_the_checkpoint(tmp_path):
    assert note_recovery(tmp_path, resumed_at=0) == Recovery()  # a first start
    assert not (tmp_path / "recovery.json").exists()
    (tmp_path / "progress.json").write_text(json.dumps({"step": 27}))
    assert note_recovery(tmp_path, resumed_at=20) == Recovery(
        restarts=1, steps_redone=7, resumed_at=20
    )
    (tmp_path / "progress.json").write_text(json.dumps({"step": 23}))
    assert note_recovery(tmp_path, resumed_at=20) == Recovery(
        restarts=2, steps_redone=10, resumed_at=20
    )
    # a checkpoint newer than the progress seen (progress lost its last writes): none redone
    (tmp_path / "progress.json").write_text(json.dumps({"step": 30}))
    assert note_recovery(tmp_path, resumed_at=40).steps_redone == 10
    assert json.loads((tmp_path / "recovery.json").read_text())["restarts"] == 3


def test_recovery_note_names_the_torchrun_restart(tmp_path, monkeypatch, capsys):
    restart = "2"
    monkeypatch.setenv("TORCHELASTIC_RESTART_COUNT", restart)
    (tmp_path / "progress.json").write_text(json.dumps({"step": 12}))
    note_recovery(tmp_path, resumed_at=10)
    assert (
        f"torchrun restart {restart}, resuming at step 10 (2 steps redone)"
        in capsys.readouterr().out
    )
