"""Helpers both halves of test_elastic.py use: tests/unit/training/test_elastic.py and
tests/integration/training/test_elastic.py (and any other test module that imports them)."""

from __future__ import annotations

from pathlib import Path

from hetflow.config import ClusterSpec, TrainConfig
from hetflow.records import Plan
from hetflow.training.launch.spec import Injection, RunSpec

STEPS, GLOBAL = 30, 64


PLAN = [8, 8, 16, 32]


def _spec(dataset, run_dir: Path, inject=(), **faults) -> RunSpec:
    train = TrainConfig(
        recipe="digits-mlp",
        global_batch=GLOBAL,
        steps=STEPS,
        checkpoint_every=10,
        eval_every=10,
        faults={"on_loss": "continue", **faults},
    )
    return RunSpec(
        run_name=run_dir.name,
        variant="t",
        cluster=ClusterSpec.from_speeds([1, 1, 2, 4], time_scale=2.0),
        dataset=dataset,
        train=train,
        plan=Plan.equal(PLAN),
        run_dir=str(run_dir),
        inject=[Injection(rank=r, step=s, kind=k) for r, s, k in inject],
    )
