"""Helpers both halves of test_fsdp.py use: tests/unit/training/test_fsdp.py and
tests/integration/training/test_fsdp.py (and any other test module that imports them)."""

from __future__ import annotations

from pathlib import Path

import torch
from torch.distributed.checkpoint.format_utils import dcp_to_torch_save

from hetflow.config import ClusterSpec, TrainConfig
from hetflow.records import Plan
from hetflow.training.launch.spec import RunSpec

STEPS = 3


def fsdp_spec(dataset, run_dir: Path, plan: list[int], strategy: str = "fsdp") -> RunSpec:
    train = TrainConfig(
        recipe="digits-mlp",
        global_batch=sum(plan),
        steps=STEPS,
        optimizer="sgd",
        lr=0.3,
        momentum=0.9,
        schedule="proportional",
        target_accuracy=None,
        eval_every=2,
        checkpoint_every=2,
        strategy=strategy,
    )
    run_dir.mkdir(parents=True, exist_ok=True)
    return RunSpec(
        run_name=run_dir.name,
        variant=run_dir.name,
        cluster=ClusterSpec.from_speeds([1.0] * len(plan), emulate=False),
        dataset=dataset,
        train=train,
        plan=Plan.equal(plan),
        run_dir=str(run_dir),
    )


def dcp_state(folder: Path, tmp_path: Path) -> dict:
    """A DCP folder's state, whole, as `sharded.save_shards` wrote it ({"model", "optim"})."""
    dcp_to_torch_save(folder, tmp_path / "whole.pt")
    return torch.load(tmp_path / "whole.pt", weights_only=False)


def assert_same_momentum(saved: dict, model: dict, opt: dict) -> None:
    """`saved` (optimizer state keyed by name) holds the momentum of `opt` (keyed by index)."""
    for i, name in enumerate(model):
        torch.testing.assert_close(
            saved["state"][name]["momentum_buffer"],
            opt["state"][i]["momentum_buffer"],
            atol=1e-5,
            rtol=0,
        )
