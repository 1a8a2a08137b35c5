"""A rank's launch by phase: recorded by real torchrun ranks, reported as the run's figures, and
a rank's entry module that imports neither the orchestration (Prefect, MLflow, Ray) nor torch's
sharded-training stack, which a DDP rank never uses."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from hetflow.infra.report.table import PHASES, launch_phases
from hetflow.training.launch.startup import StartupMarks

ROOT = Path(__file__).resolve().parents[3]


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
