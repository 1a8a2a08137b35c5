"""The whole torchrun job dies mid-training (agent and workers SIGKILLed, as when the flow's
process tree is lost): Prefect retries the train task, which launches again in the same run
directory, resumes from the last checkpoint, finishes every step and completes the same MLflow
run, with `restarts` and `steps_redone` recorded. The cluster names EC2 instance types (from
moto's EC2 API): the emulation takes its speeds from the catalog and the run reports its cost."""

from __future__ import annotations

import json
import os
import signal
import threading
import time
from pathlib import Path

import pytest

from hetflow.config import ClusterSpec, DatasetSpec, TrackingConfig, TrainConfig
from hetflow.infra.catalog import Catalog
from hetflow.infra.data.format import read_manifest
from hetflow.infra.paths import runs_dir

from tests.procs import pids_with

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]

STEPS, EVERY, KILL_AT = 120, 10, 25


def _job_pids(home: Path) -> list[int]:
    """torchrun agents and workers of train runs under this test's HETFLOW_HOME."""
    return pids_with(str(home), "-optimized", "job.json")


def _kill_job_when_it_reaches(step: int, home: Path, killed: list, stop: threading.Event) -> None:
    while not stop.is_set():
        for progress in runs_dir().glob("*-optimized/progress.json"):
            try:
                done = json.loads(progress.read_text())["step"]
            except (OSError, ValueError, KeyError):
                continue
            if done >= step:
                pids = _job_pids(home)
                for pid in pids:
                    try:
                        os.kill(pid, signal.SIGKILL)
                    except ProcessLookupError:
                        pass
                killed.append((done, pids))
                return
        time.sleep(0.05)


def test_killed_job_is_retried_by_prefect_and_resumes_from_checkpoint(
    s3, prefect_harness, hetflow_home, tmp_path, fault_table
):
    from mlflow import MlflowClient

    from hetflow.flows.train import train
    from hetflow.infra.tracking.tracker import MLflowTracker

    dataset = DatasetSpec(url="s3://hetflow-flow-retry/digits", cache_dir=str(tmp_path / "cache"))
    types = ["g4dn.xlarge", "g4dn.xlarge", "p3dn.24xlarge", "g5.xlarge"]  # T4, T4, V100, A10G
    cluster = ClusterSpec.model_validate(
        {
            "name": "ec2-mix",
            "time_scale": 8.0,
            "workers": [{"name": f"w{i}", "instance_type": t} for i, t in enumerate(types)],
        }
    )
    cfg = TrainConfig.variant(
        "optimized",
        recipe="digits-mlp",
        global_batch=64,
        steps=STEPS,
        checkpoint_every=EVERY,
        eval_every=10,
    )
    killed: list = []
    stop = threading.Event()
    watcher = threading.Thread(
        target=_kill_job_when_it_reaches, args=(KILL_AT, hetflow_home, killed, stop), daemon=True
    )
    watcher.start()
    try:
        out = train(
            cluster=cluster,
            dataset=dataset,
            train=cfg,
            tracking=TrackingConfig(),
            variant="optimized",
        )
    finally:
        stop.set()
        watcher.join(timeout=5)

    assert killed and len(killed[0][1]) >= 2, f"the job was not killed: {killed}"  # agent + workers
    m = out["metrics"]
    assert m["steps"] == STEPS
    assert m["restarts"] == 1
    # killed at step >= KILL_AT: a start from zero would redo more than EVERY steps
    assert 0 <= m["steps_redone"] <= EVERY  # bounded by the checkpoint interval

    client: MlflowClient = MLflowTracker(TrackingConfig()).client
    runs = client.search_runs(
        [client.get_experiment_by_name("hetflow").experiment_id],
        filter_string="tags.variant = 'optimized'",
    )
    assert [r.info.run_id for r in runs] == [out["run_id"]]  # the retry completed the same run
    run = runs[0]
    assert run.info.status == "FINISHED"
    assert (
        run.data.metrics["restarts"] == 1 and run.data.metrics["steps_redone"] == m["steps_redone"]
    )
    # speeds from the catalog: the A10G (w3) gets the largest share, the T4s the smallest
    batches = json.loads(run.data.params["plan.local_batches"])  # every worker's, 0: left out
    assert batches[3] == max(batches) and batches[0] == min(batches), batches
    # cost: price x the training loop's hours, a p3dn's price shared by its 8 GPUs, for each
    # worker launched, under its rank in the cluster (the plan's dropped workers cost the run
    # nothing: they were not started)
    dropped = json.loads(run.data.params["plan.dropped"])
    launched = [i for i in range(len(types)) if f"w{i}" not in dropped]
    catalog = Catalog.for_cluster(cluster)
    hours = run.data.metrics["train_loop_s"] / 3600
    for i in launched:
        share = catalog.price(types[i]) / catalog.info(types[i]).devices
        assert run.data.metrics[f"rank{i}/cost_usd"] == pytest.approx(share * hours, rel=1e-6)
    assert not [i for i in range(len(types)) if i not in launched and f"rank{i}/cost_usd" in m]
    assert run.data.metrics["cost_usd"] == pytest.approx(
        sum(run.data.metrics[f"rank{i}/cost_usd"] for i in launched), rel=1e-6
    )
    epochs = STEPS * cfg.global_batch / read_manifest(dataset.url).splits["train"].samples
    assert run.data.metrics["cost_per_epoch_usd"] == pytest.approx(
        run.data.metrics["cost_usd"] / epochs, rel=1e-3
    )
    fault_table.append(
        (
            "SIGKILL of torchrun and all workers",
            "train flow",
            "finished, task retried",
            int(m["steps_redone"]),
            "none",
            1,
        )
    )
