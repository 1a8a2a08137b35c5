"""Local SGD in the training loop, on real gloo ranks: with unequal batches and a rank left out,
averaging every step weighted by samples trains exactly as the gradient's all-reduce does."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from hetflow.config import ClusterSpec, DatasetSpec, TrainConfig
from hetflow.records import CompressionMethod, Plan, RunResult
from hetflow.training.comm import DENSE_WARMUP_STEPS, ring_allreduce_bytes

from tests.dist import run_ranks

PLAN = [4, 12, 0]  # unequal, and rank 2 left out: its momentum from the warm-up still moves it
STEPS = DENSE_WARMUP_STEPS + 3


def train_rank(rank: int, world: int, arg: dict) -> dict:
    """One rank of hetflow's worker on the job `arg` (a RunSpec's JSON); rank 0 writes
    model.pt."""
    from hetflow.training import worker
    from hetflow.training.launch.spec import RunSpec

    worker.run(RunSpec.model_validate(arg), rank)
    return {}


def _trained(dataset: DatasetSpec, run_dir: Path, method: str) -> dict[str, torch.Tensor]:
    from hetflow.training.launch.spec import RunSpec

    run_dir.mkdir(parents=True)
    spec = RunSpec(
        run_name=run_dir.name,
        variant=method,
        cluster=ClusterSpec.from_speeds([1.0] * len(PLAN), emulate=False),
        dataset=dataset,
        train=TrainConfig(
            recipe="digits-mlp",
            global_batch=sum(PLAN),
            steps=STEPS,
            optimizer="sgd",
            lr=0.1,
            momentum=0.9,
            schedule="equal",
            compression=method,
            eval_every=100,
            checkpoint_every=100,
            target_accuracy=None,
        ),
        plan=Plan(local_batches=PLAN, compression=CompressionMethod.parse(method)),
        run_dir=str(run_dir),
    )
    run_ranks(train_rank, len(PLAN), spec.model_dump(mode="json"), run_dir / "ranks")
    return torch.load(run_dir / "model.pt")


def _result(run_dir: Path) -> RunResult:
    return RunResult.model_validate_json((run_dir / "result.json").read_text())


@pytest.mark.slow
@pytest.mark.timeout(180)
def test_local_sgd_of_period_one_trains_as_the_all_reduce_with_unequal_batches(
    local_digits, tmp_path
):
    # Each rank steps on its own mean and the average weighs it by its samples (rank 2: 0), so
    # period 1 is SGD with momentum on the global batch. Weighting equally (or each rank's
    # step by its batch as well) would not be: rank 2's replica would pull the average.
    local = _trained(local_digits, tmp_path / "local", "localsgd:1")
    dense = _trained(local_digits, tmp_path / "dense", "none")
    assert local.keys() == dense.keys()
    for k in local:
        torch.testing.assert_close(local[k], dense[k], atol=1e-5, rtol=0)


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_a_run_ending_between_averages_averages_once_more_in_its_last_step(local_digits, tmp_path):
    # localsgd:4 averages after step 10 (the warm-up's end), then would after step 14: steps
    # 11 and 12 leave the replicas apart, and the run's end averages them, in step 12's time
    weights = _trained(local_digits, tmp_path / "local", "localsgd:4")
    params = sum(v.numel() for k, v in weights.items() if k.endswith(("weight", "bias")))
    average = ring_allreduce_bytes(4 * params, len(PLAN))
    sent = [r.bytes_sent for r in _result(tmp_path / "local").lead.records]
    assert sent[DENSE_WARMUP_STEPS:] == [average, 0.0, average]
