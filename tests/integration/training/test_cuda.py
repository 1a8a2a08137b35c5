"""On a CUDA device (skipped where there is none; CI has none): a run on the GPU, a mixed
GPU/CPU run over gloo, and mixed precision by the device's capability."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from hetflow.config import ClusterSpec, TrainConfig, WorkerSpec
from hetflow.records import Plan, RunResult
from hetflow.training.devices import HostDevices, resolve_precision
from hetflow.training.launch.run import run_workers
from hetflow.training.launch.spec import RunSpec

from tests.integration.training.test_training import _assert_same_params, _weights_after_one_step

pytestmark = [
    pytest.mark.cuda,
    pytest.mark.slow,
    pytest.mark.timeout(300),
    pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device"),
]


def _spec(dataset, tmp_path, name, workers, plan, precision="fp32", steps=1) -> RunSpec:
    train = TrainConfig(
        recipe="digits-mlp",
        global_batch=sum(plan),
        steps=steps,
        lr=0.5,
        momentum=0.0,
        schedule="proportional",
        target_accuracy=None,
        precision=precision,
    )
    return RunSpec(
        run_name=name,
        variant=name,
        cluster=ClusterSpec(workers=workers, emulate=False),
        dataset=dataset,
        train=train,
        plan=Plan.equal(plan),
        run_dir=str(tmp_path / name),
    )


@pytest.mark.parametrize(
    "devices", [("cuda", "cuda"), ("cuda", "cpu")], ids=["gpu-only", "gpu-and-cpu"]
)
def test_a_step_on_the_gpu_equals_one_process_on_the_cpu(digits, tmp_path, devices):
    workers = [WorkerSpec(name=f"w{i}", device=d) for i, d in enumerate(devices)]
    spec = _spec(digits, tmp_path, "-".join(devices), workers, [13, 19])
    run_workers(spec, timeout_s=250)
    job = json.loads((Path(spec.run_dir) / "job.json").read_text())
    expected = "nccl" if devices == ("cuda", "cuda") and torch.cuda.device_count() > 1 else "gloo"
    assert job["backend"] == expected
    trained = torch.load(Path(spec.run_dir) / "model.pt")
    _assert_same_params(trained, _weights_after_one_step(spec))


def test_auto_precision_on_the_gpu_trains(digits, tmp_path):
    workers = [WorkerSpec(name="w0", device="cuda")]
    spec = _spec(digits, tmp_path, "auto", workers, [64], precision="auto", steps=20)
    result, _ = run_workers(spec, timeout_s=250)
    job = json.loads((Path(spec.run_dir) / "job.json").read_text())
    assert job["precisions"] == [resolve_precision("auto", "cuda:0", HostDevices.here())]
    records = RunResult.model_validate(result).ranks[0].records
    losses = [r.loss_sum / r.count for r in records if not r.skipped]
    assert losses[-1] < losses[0]


def test_the_memory_probe_searches_the_largest_batch_on_the_gpu():
    import numpy as np

    from hetflow.training.probes.memory import cuda_cap_batch
    from hetflow.training.recipes import DataInfo, get_recipe, seeded_model

    recipe = get_recipe("digits-mlp")
    model = seeded_model(recipe, DataInfo(), 0).to("cuda")
    x = np.random.default_rng(0).random((64, 64), dtype=np.float32)
    y = np.zeros(64, dtype=np.int64)
    cap = cuda_cap_batch(model, x, y, recipe, limit=1 << 12)
    assert 0 < cap <= 1 << 12
