"""The queue's moves in place: a job that runs elastic (`QueueJob.in_place`) gives a worker to
another at a step boundary, and takes it back at another when that one ends, without a stop at
a checkpoint or a relaunch; its MLflow run shows both changes of membership."""

from __future__ import annotations

import contextlib
import json
import threading
import time

import pytest

from hetflow.config import ClusterSpec, DatasetSpec, TrackingConfig
from hetflow.config.queue import QueueJob

STEPS = 300


def submit_when_stepping(job: QueueJob, low: str, at_step: int) -> None:
    """`job` into the inbox (as `hetflow queue submit` leaves it) once the run of `low` has
    reached `at_step`: a move while `low` trains, however long its launch took."""
    from hetflow.infra.paths import queue_dir, runs_dir

    deadline = time.monotonic() + 600
    while time.monotonic() < deadline:
        for progress in runs_dir().glob(f"*-{low}/progress.json"):
            with contextlib.suppress(ValueError, KeyError):
                if json.loads(progress.read_text())["step"] >= at_step:
                    inbox = queue_dir() / "inbox"
                    inbox.mkdir(parents=True, exist_ok=True)
                    (inbox / f"{job.name}.json").write_text(job.model_dump_json())
                    return
        time.sleep(0.1)


def low_then_high(tmp_path) -> dict:
    """A queue session on two workers of speed 1: `low` (elastic, `STEPS` steps) from the
    start, `high` (4 steps) submitted once `low` steps; the flow's output."""
    from hetflow.flows.job_queue import queue

    common = {"recipe": "digits-mlp", "global_batch": 512, "checkpoint_every": 100}
    low = QueueJob(name="low", priority="low", steps=STEPS, in_place=True, **common)
    high = QueueJob(name="high", priority="high", steps=4, **common)
    submitter = threading.Thread(target=submit_when_stepping, args=(high, "low", 10))
    submitter.start()
    out = queue(
        jobs=[low],
        cluster=ClusterSpec.from_speeds([1, 1], time_scale=20.0, name="q2"),
        dataset=DatasetSpec(url="s3://hetflow-queue/digits", cache_dir=str(tmp_path / "c")),
        tracking=TrackingConfig(),
        switch_s=600.0,
        in_place_s=0.1,
        read_inbox=True,
    )
    submitter.join(timeout=5)
    return out


def low_run(out: dict):
    """(the MLflow client, `low`'s run under the session's parent run)."""
    from mlflow.tracking import MlflowClient

    from hetflow.infra.tracking.tracker import MLflowTracker

    client = MlflowClient(MLflowTracker(TrackingConfig()).tracking_uri)
    parent = out["parent_run_id"]
    children = client.search_runs(
        [client.get_run(parent).info.experiment_id], f"tags.mlflow.parentRunId = '{parent}'"
    )
    (run,) = [r for r in children if r.info.run_name == "low"]
    return client, run


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_a_job_gives_a_worker_up_and_takes_it_back_in_place(
    s3, prefect_harness, tmp_path, hetflow_home
):
    """`low` (elastic) holds both workers; `high` arrives while it trains and the allocator
    gives it one of them, at a relaunch's price far above what the move gains, but in place:
    `low` lets the worker go at a step and goes on; `high` starts on it before `low` ends;
    when `high` ends, `low` takes the worker back in place (a spare slot of its launch, the
    worker joining at a step boundary). One launch of `low`, every step once, none redone;
    its MLflow run records both changes of membership; every worker's slot is free at the
    end."""
    from prefect.client.orchestration import get_client

    from hetflow.infra.paths import runs_dir
    from hetflow.tasks.queue import slot_name

    out = low_then_high(tmp_path)
    rows = {r["job"]: r for r in out["jobs"]}
    assert rows["low"]["segments"] == 1  # one launch: no stop, no relaunch
    assert rows["low"]["moved_in_place"] == 1 and rows["low"]["grown_in_place"] == 1
    assert out["figures"]["steps_redone"] == 0
    assert 0 < out["figures"]["in_place_s"] < 600.0  # measured
    # the worker back: a process of the session's warm pool (low's launch, as the pool opens,
    # finds at most one started)
    assert out["figures"]["warm_joins"] == 1 and out["figures"]["warm_ranks"] >= 1
    (grow,) = [m for m in out["moves"] if m["grown"]]
    assert grow["to"] == "low" and grow["taker_s"] is not None  # low stepped with it again
    (result,) = runs_dir().glob("*-low/result.json")
    steps = [s["step"] for s in json.loads(result.read_text())["ranks"][0]["records"]]
    assert steps == list(range(STEPS))  # every step once, none redone
    client, run = low_run(out)
    path = client.download_artifacts(run.info.run_id, "membership.json", str(tmp_path))
    left, joined = json.loads(open(path).read())
    assert len(left["lost"]) == 1 and left["world"] == 1 and 10 <= left["step"]
    assert len(joined["joined"]) == 1 and joined["world"] == 2 and joined["step"] < STEPS
    assert client.get_metric_history(run.info.run_id, "membership.world")[-1].value == 2
    high_from = min(a for job, _, a, _ in out["spans"] if job == "high")
    low_until = max(b for job, _, _, b in out["spans"] if job == "low")
    assert high_from < low_until
    with get_client(sync_client=True) as prefect:
        assert prefect.read_global_concurrency_limit_by_name(slot_name("speed-1")).active_slots == 0


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_a_job_moved_wholly_to_another_worker_moves_in_place(
    s3, prefect_harness, tmp_path, hetflow_home, monkeypatch
):
    """`low` (elastic) runs on w0 alone; `high` arrives and the allocator's answer (fixed
    here: which workers it picks is outside the claim) sends `low` wholly to w1 and gives
    `high` w0. `low` keeps none of its workers, yet moves in place: w1 joins it at a step
    boundary first, then w0 leaves, and `high` starts on w0 before `low` ends. One launch of
    `low`, w1 stepping from its join to the end, none redone; its MLflow run records the
    join before the leave."""

    from hetflow.infra.paths import runs_dir
    from hetflow.tasks.queue_session import Session

    def allocate(self, act, holding):
        names = {j.job.name for j in act}
        self.high_seen = getattr(self, "high_seen", False) or "high" in names
        got = {"low": ["w1"], "high": ["w0"]} if self.high_seen else {"low": ["w0"]}
        return {n: w for n, w in got.items() if n in names}

    monkeypatch.setattr(Session, "allocate", allocate)
    out = low_then_high(tmp_path)
    rows = {r["job"]: r for r in out["jobs"]}
    assert rows["low"]["segments"] == 1  # one launch: no stop, no relaunch
    assert rows["low"]["moved_in_place"] == 1 and rows["low"]["grown_in_place"] == 1
    assert "high" in rows and out["figures"]["steps_redone"] == 0  # rows: the jobs done
    (result,) = runs_dir().glob("*-low/result.json")
    (lead,) = json.loads(result.read_text())["ranks"]  # w1's rank: w0's left with w0
    steps = [s["step"] for s in lead["records"]]
    client, run = low_run(out)
    path = client.download_artifacts(run.info.run_id, "membership.json", str(tmp_path))
    joined, left = json.loads(open(path).read())
    assert len(joined["joined"]) == 1 and joined["world"] == 2 and 10 <= joined["step"]
    assert len(left["lost"]) == 1 and left["world"] == 1 and joined["step"] <= left["step"]
    assert lead["rank"] == 1 and steps == list(range(joined["step"], STEPS))  # none redone
    spans = {(job, w): (a, b) for job, w, a, b in out["spans"]}
    assert spans[("low", "w0")][1] <= spans[("high", "w0")][0] < spans[("low", "w1")][1]
