"""The emulated device model (`hetflow.emulation.device_model`): each device's own curve,
noise at measured levels with slow stretches, stragglers that drift or jump, a memory cliff;
and how the cluster file, the job file and `hetflow bench hetero` name them."""

from __future__ import annotations

import statistics

import pytest

from hetflow.config import ClusterSpec, WorkerSpec
from hetflow.records import Plan


@pytest.mark.slow
@pytest.mark.timeout(180)
def test_a_drifting_straggler_slows_a_real_emulated_rank_step_by_step(digits, tmp_path):
    """Two flat workers of one speed (`knee_batch: 1`, no noise) on an equal plan; rank 1 drifts
    to 3x over steps 4-12: its compute stays level with rank 0's before the onset, is part of
    the way during the ramp and about 3x after it (the job file carries the 4-field entry)."""
    from hetflow.config import FaultPolicy, TrainConfig
    from hetflow.training.launch.run import run_workers
    from hetflow.training.launch.spec import RunSpec

    workers = [WorkerSpec(name=f"w{i}", speed=1.0, knee_batch=1) for i in range(2)]
    spec = RunSpec(
        run_name="drift",
        variant="static",
        cluster=ClusterSpec(workers=workers, noise="none"),
        dataset=digits,
        train=TrainConfig(
            recipe="digits-cnn",
            global_batch=32,
            steps=18,
            schedule="equal",
            eval_every=100,
            checkpoint_every=100,
            target_accuracy=None,
            faults=FaultPolicy(group_restarts=0),
        ),
        plan=Plan.equal([16, 16]),
        stragglers=[(1, 4, 3.0, 8)],
        run_dir=str(tmp_path),
    )
    result, _ = run_workers(spec, timeout_s=150)
    compute = {
        r["rank"]: {x["step"]: x["compute_s"] for x in r["records"]} for r in result["ranks"]
    }

    def ratio(steps):
        return statistics.median(compute[1][s] / compute[0][s] for s in steps)

    before, during, after = ratio(range(1, 4)), ratio(range(7, 10)), ratio(range(13, 18))
    assert before < 1.4 and after > 2.2, (before, during, after)
    assert before < during < after, (before, during, after)
