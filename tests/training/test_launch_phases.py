"""A rank's launch by phase: recorded by real torchrun ranks, reported as the run's figures, and
a rank's entry module that imports neither the orchestration (Prefect, MLflow, Ray) nor torch's
sharded-training stack, which a DDP rank never uses."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from hetflow.config import ClusterSpec, TrainConfig
from hetflow.infra.report.table import PHASES, launch_phases
from hetflow.records import Plan, RunResult, StartupPhases
from hetflow.training.launch.run import run_workers
from hetflow.training.launch.spec import RunSpec
from hetflow.training.launch.startup import StartupMarks
from hetflow.training.metrics import summarize

ROOT = Path(__file__).resolve().parents[2]


def test_phases_follow_one_another_and_an_unmarked_one_counts_in_the_next():
    marks = StartupMarks()
    marks.started = 11.0
    marks.at = {"import": 13.0, "data": 14.0, "model": 16.5}  # no rendezvous mark
    p = marks.phases(10.0, first_step_s=8.0, trials_s=0.5)
    assert (p.spawn_s, p.import_s, p.rendezvous_s, p.data_s) == (1.0, 2.0, 0.0, 1.0)
    assert (p.model_s, p.first_step_s) == (2.0, 1.5)
    assert sum(v for _, v in p) + 0.5 == pytest.approx(8.0)
    with pytest.raises(ValueError, match="unknown start-up phase"):
        marks.mark("imports")


def test_launch_phases_reads_each_ranks_phases_from_the_flat_figures():
    flat = {"startup_s": 9.0, "rank0/startup_s": 9.0, "rank0/busy_fraction": 0.5}
    flat |= {f"rank{r}/startup_{p}_s": 1.0 for r in (0, 1) for p in PHASES}
    got = launch_phases(flat)
    assert list(got) == [0, 1]
    assert list(got[0]) == [*PHASES, "startup"] and list(got[1]) == list(PHASES)
    assert launch_phases({"rank0/startup_s": 9.0}) == {}  # no phase recorded: no view


@pytest.mark.slow
@pytest.mark.timeout(240)
def test_torchrun_ranks_record_every_phase_within_their_startup(digits, tmp_path):
    cluster = ClusterSpec.from_speeds([1.0, 1.0], emulate=False)
    train = TrainConfig(
        recipe="digits-mlp", global_batch=16, steps=2, schedule="proportional", compression="none"
    )
    spec = RunSpec(
        run_name="phases",
        variant="phases",
        cluster=cluster,
        dataset=digits,
        train=train,
        plan=Plan.equal([8, 8]),
        run_dir=str(tmp_path / "phases"),
    )
    raw, _ = run_workers(spec, timeout_s=200)
    result = RunResult.model_validate(raw)
    for rank in result.ranks:
        line = rank.timeline
        phases = line.startup
        assert phases != StartupPhases(), f"rank {rank.rank} recorded no phase"
        # the process was spawned and imported torch; every phase is a duration
        assert phases.spawn_s > 0 and phases.import_s > 0
        assert all(v >= 0 for _, v in phases)
        # one after another from the submit: with the trials, no more than the start-up
        assert sum(v for _, v in phases) + line.trials_s <= line.first_step_s + 1e-6
    m = summarize(result, train.global_batch)
    named = [f"startup_{p}_s" for p in PHASES]
    flat = m.flat()
    for r in (0, 1):
        assert all(f"rank{r}/{n}" in flat for n in named)
        assert sum(flat[f"rank{r}/{n}"] for n in named) <= flat[f"rank{r}/startup_s"] + 1e-6
    assert sum(getattr(m, n) for n in named) <= m.startup_s + 1e-6
    assert list(launch_phases(flat)) == [0, 1]


def test_a_ranks_entry_imports_no_orchestration_nor_sharded_training():
    """`python -m hetflow.training.worker` imports what a rank runs: torch, the loop, the
    data layer; Prefect, MLflow and Ray are the driver's, and torch's checkpoint, FSDP and
    DTensor stack (with sympy) an fsdp run's only, imported where it is used."""
    heavy = [
        "prefect",
        "mlflow",
        "ray",
        "pandas",
        "matplotlib",
        "s3fs",
        "sympy",
        "torch.distributed.checkpoint",
        "torch.distributed.fsdp",
        "torch.distributed.tensor",
    ]
    code = (
        "import json, sys\n"
        "import hetflow.training.worker\n"
        f"print(json.dumps([m for m in {heavy!r} if m in sys.modules]))\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True
    )
    assert json.loads(out.stdout.strip().splitlines()[-1]) == []
