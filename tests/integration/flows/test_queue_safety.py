"""One bad job never takes the queue down: `hetflow queue submit` refuses, in one line naming
the flag, a job that could not run (its recipe, its data); a job that fails at run time ends
alone, `failed` with its reason in `queue list`, Prefect and MLflow, while the others run to
their end; `hetflow queue cancel` takes a queued job out and stops a running one at its next
checkpoint."""

from __future__ import annotations

import json
import threading
import time

import pytest

from hetflow.cli import main
from hetflow.config import ClusterSpec, DatasetSpec, TrackingConfig
from hetflow.config.queue import QueueJob


def cancel_when_running(home, name: str, said: list[str]) -> None:
    """`hetflow queue cancel NAME` once `queue list` would show NAME running."""
    state = home / "queue" / "state.json"
    deadline = time.monotonic() + 600
    while time.monotonic() < deadline:
        rows = json.loads(state.read_text()) if state.exists() else []
        if any(r["name"] == name and r["state"] == "running" for r in rows):
            said.append(str(main(["queue", "cancel", name])))
            return
        time.sleep(0.2)


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_a_failing_job_ends_alone_and_a_running_one_is_cancelled_at_its_checkpoint(
    s3, prefect_harness, tmp_path, hetflow_home, capsys
):
    """Three jobs on three workers: `bad`'s recipe raises at its first evaluation, its 4th
    step (step 3, counted from 0), `long` is cancelled once running, `good` runs to its end."""
    from mlflow.tracking import MlflowClient
    from prefect.client.orchestration import get_client

    from hetflow.flows.job_queue import queue
    from hetflow.infra.tracking.tracker import MLflowTracker
    from hetflow.tasks.queue import slot_name

    mlp = {"recipe": "digits-mlp", "global_batch": 32, "checkpoint_every": 4}
    jobs = [
        QueueJob(name="good", steps=8, **mlp),
        QueueJob(name="long", steps=400, **mlp),
        QueueJob(name="bad", steps=8, **(mlp | {"recipe": "tests.queue_recipes:FailsAtFirstEval"})),
    ]
    said: list[str] = []
    canceller = threading.Thread(target=cancel_when_running, args=(hetflow_home, "long", said))
    canceller.start()
    out = queue(
        jobs=jobs,
        cluster=ClusterSpec.from_speeds([1, 1, 2], time_scale=1.0, name="q3"),
        dataset=DatasetSpec(url="s3://hetflow-queue-safe/digits", cache_dir=str(tmp_path / "c")),
        tracking=TrackingConfig(),
        switch_s=0.0,
        read_inbox=False,
    )
    canceller.join(timeout=5)
    assert said == ["0"]
    assert [r["job"] for r in out["jobs"]] == ["good"]  # the one that ran to its end
    assert (out["figures"]["jobs_failed"], out["figures"]["jobs_cancelled"]) == (1, 1)
    rows = {r["name"]: r for r in json.loads((hetflow_home / "queue/state.json").read_text())}
    assert rows["good"]["state"] == "done" and rows["good"]["steps_done"] == 8
    assert rows["bad"]["state"] == "failed"
    assert rows["bad"]["reason"].startswith("rank 0 (step 3): RuntimeError: the test recipe")
    stopped = rows["long"]["steps_done"]
    assert rows["long"]["state"] == "cancelled" and 0 < stopped < 400 and stopped % 4 == 0
    assert rows["long"]["reason"] == f"cancelled at its checkpoint, step {stopped}"
    assert all(r["workers"] == [] for r in rows.values())

    assert main(["queue", "list"]) == 0
    listed = {line.split()[0]: line for line in capsys.readouterr().out.splitlines()[1:]}
    assert listed["bad"].split()[2] == "failed" and rows["bad"]["reason"] in listed["bad"]

    client = MlflowClient(MLflowTracker(TrackingConfig()).tracking_uri)
    parent = out["parent_run_id"]
    children = client.search_runs(
        [client.get_run(parent).info.experiment_id], f"tags.mlflow.parentRunId = '{parent}'"
    )
    runs = {r.info.run_name: r for r in children}
    assert runs["good"].info.status == "FINISHED"
    assert runs["bad"].info.status == "FAILED"
    assert runs["bad"].data.tags["queue_reason"] == rows["bad"]["reason"]
    assert runs["long"].info.status == "KILLED"
    assert client.get_run(parent).info.status == "FINISHED"  # the session went on

    with get_client(sync_client=True) as prefect:
        for kind in ("speed-1", "speed-2"):
            limit = prefect.read_global_concurrency_limit_by_name(slot_name(kind))
            assert limit.active_slots == 0  # every worker back in the pool
