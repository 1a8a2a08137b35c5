"""A rank's launch by phase: recorded by real torchrun ranks, reported as the run's figures, and
a rank's entry module that imports neither the orchestration (Prefect, MLflow, Ray) nor torch's
sharded-training stack, which a DDP rank never uses."""

from __future__ import annotations

import pytest

from hetflow.config import ClusterSpec, TrainConfig
from hetflow.infra.report.table import PHASES, launch_phases
from hetflow.records import Plan, RunResult, StartupPhases
from hetflow.training.launch.run import run_workers
from hetflow.training.launch.spec import RunSpec
from hetflow.training.metrics import summarize


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
