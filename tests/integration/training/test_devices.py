"""Devices, the backend and mixed precision: the policy on any host, and ranks of different
precisions that still step on one exact gradient (CPU autocast, 4 processes)."""

from __future__ import annotations

import pytest

from hetflow.config import ClusterSpec, TrainConfig, WorkerSpec


@pytest.mark.slow
@pytest.mark.timeout(240)
def test_a_run_of_bf16_and_fp16_workers_trains_and_resumes_its_loss_scale(digits, tmp_path):
    """Through torchrun and the training loop: the job file carries the backend and each
    rank's precision, every step is recorded alike on both ranks, the checkpoint keeps the
    loss scale, and the model learns."""
    import json
    from pathlib import Path

    from hetflow.records import Plan, RunResult
    from hetflow.training.launch.run import run_workers
    from hetflow.training.launch.spec import RunSpec
    from hetflow.training.loop.checkpoint_store import CheckpointStore

    spec = RunSpec(
        run_name="amp",
        variant="amp",
        cluster=ClusterSpec(
            workers=[
                WorkerSpec(name="a", precision="bf16"),
                WorkerSpec(name="b", precision="fp16"),
            ],
            emulate=False,
        ),
        dataset=digits,
        train=TrainConfig(
            recipe="digits-mlp", global_batch=64, steps=8, lr=0.1, checkpoint_every=4
        ),
        plan=Plan.equal([24, 40]),
        run_dir=str(tmp_path / "amp"),
    )
    result, _ = run_workers(spec, timeout_s=200)
    job = json.loads((Path(spec.run_dir) / "job.json").read_text())
    assert job["backend"] == "gloo" and job["precisions"] == ["bf16", "fp16"]
    ranks = RunResult.model_validate(result).ranks
    for r in ranks:
        assert [rec.step for rec in r.records] == list(range(8))
        assert [rec.skipped for rec in r.records] == [rec.skipped for rec in ranks[0].records]
    losses = [rec.loss_sum / rec.count for rec in ranks[0].records if not rec.skipped]
    assert losses[-1] < losses[0]
    saved = CheckpointStore(f"{spec.run_dir}/checkpoints").load()
    # the newest checkpoint, the last step's (on the interval), keeps the shared scale
    assert saved["step"] == 8 and saved["scaler"]["scale"] > 0
