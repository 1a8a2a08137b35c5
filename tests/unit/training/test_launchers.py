"""One launcher interface: `run.run_workers` checks a job, then hands it to torchrun or Ray
Train as the cluster's `launcher` says, and neither launcher imports the other. The launchers
themselves are replaced by recorders here; real runs under each are in test_training.py and
test_ray.py."""

from __future__ import annotations

import ast

import pytest

from hetflow.config import ClusterSpec, ConfigError, DatasetSpec, TrainConfig, WorkerSpec
from hetflow.records import Plan
from hetflow.training.launch import run as run_module
from hetflow.training.launch.outcome import Launched
from hetflow.training.launch.spec import RunSpec

from tests.unit.test_layout import ROOT, all_imports

LAUNCHERS = {
    "local": "hetflow.training.launch.local",
    "ray_train": "hetflow.training.launch.ray_train",
}


@pytest.mark.parametrize("name", sorted(LAUNCHERS))
def test_neither_launcher_imports_the_other(name):
    imports = all_imports(ast.parse((ROOT / "training/launch" / f"{name}.py").read_text()))
    others = {m for n, m in LAUNCHERS.items() if n != name} | {"hetflow.training.launch.run"}
    assert not imports & others, f"{name} imports {sorted(imports & others)}"


@pytest.fixture
def handed(monkeypatch) -> list[tuple[str, RunSpec]]:
    """(launcher, job) for each job `run_workers` hands on; each returns an empty result."""
    seen: list[tuple[str, RunSpec]] = []

    def recorder(name):
        def launch(spec, *args, **kwargs):
            seen.append((name, spec))
            return Launched({}, 0.0)

        return launch

    monkeypatch.setattr(run_module, "run_torchrun", recorder("torchrun"))
    monkeypatch.setattr(run_module, "run_workers_ray", recorder("ray"))
    return seen


def _spec(tmp_path, launcher: str, **worker) -> RunSpec:
    workers = [WorkerSpec(name=f"w{i}", **worker) for i in range(2)]
    return RunSpec(
        run_name="r",
        variant="r",
        cluster=ClusterSpec(workers=workers, launcher=launcher),
        dataset=DatasetSpec(url="s3://bucket/digits"),
        train=TrainConfig(recipe="digits-mlp", global_batch=8, steps=1),
        plan=Plan.equal([4, 4]),
        run_dir=str(tmp_path / "r"),
    )


@pytest.mark.parametrize("launcher, expected", [("local", "torchrun"), ("ray", "ray")])
def test_the_cluster_launcher_chooses_the_launcher(handed, tmp_path, launcher, expected):
    raw, wall = run_module.run_workers(_spec(tmp_path, launcher))
    ((name, spec),) = handed
    assert name == expected and (raw, wall) == ({}, 0.0)
    assert spec.backend == "gloo" and spec.precisions and spec.submitted_at
    # under Ray the run's state goes to the dataset's bucket, where every node finds it
    assert (spec.state_url == "s3://bucket/runs/r") == (launcher == "ray")


def test_a_device_this_host_lacks_is_refused_before_torchrun(handed, tmp_path):
    spec = _spec(tmp_path, "local", device="cuda")
    with pytest.raises(ConfigError, match=r"device"):
        run_module.run_workers(spec)
    assert handed == []
