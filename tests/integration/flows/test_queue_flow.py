"""The queue as a user drives it: `hetflow queue submit` refuses bad jobs in one line and
leaves good ones in the inbox; the `queue` flow runs jobs of two classes on one emulated
cluster, the higher one taking workers at the lower one's checkpoint, each job's run nested
under the session's MLflow run with the plot of who held which worker."""

from __future__ import annotations

import pytest

from hetflow.config import ClusterSpec, DatasetSpec, TrackingConfig
from hetflow.config.queue import QueueJob


@pytest.mark.slow
@pytest.mark.timeout(900)
@pytest.mark.parametrize("measure_first", [False, True], ids=["from-a-prior", "measured-first"])
def test_a_high_job_takes_workers_at_the_low_jobs_checkpoint(
    s3, prefect_harness, tmp_path, measure_first
):
    """Placed from a prior (the workers name no preset: the equal split), the recipe's lines
    are learned from `low`'s own steps (its re-balancer's points, written beside its
    progress); measured first (`measure_first`), they come from the profile, and nothing is
    learned so."""
    from mlflow.tracking import MlflowClient

    from hetflow.flows.job_queue import queue
    from hetflow.infra.tracking.tracker import MLflowTracker

    cluster = ClusterSpec.from_speeds([1, 2], time_scale=1.0, name="q2")
    jobs = [
        QueueJob(
            name="low",
            priority="low",
            recipe="digits-mlp",
            # still running when high is in: 40 steps took 2 s on a loaded 2-core host, less
            # than low's launch and high's admission after it took there
            steps=160,
            global_batch=32,
            checkpoint_every=4,
        ),
        QueueJob(
            name="high",
            priority="high",
            recipe="digits-mlp",
            steps=4,
            global_batch=32,
            checkpoint_every=4,
            arrive_after_s=1,
        ),
    ]
    out = queue(
        jobs=jobs,
        cluster=cluster,
        dataset=DatasetSpec(url="s3://hetflow-queue/digits", cache_dir=str(tmp_path / "c")),
        tracking=TrackingConfig(),
        switch_s=0.0,
        read_inbox=False,
        measure_first=measure_first,
    )
    rows = {r["job"]: r for r in out["jobs"]}
    learned = out["units"]  # what the jobs' steps measured of the kinds: none measured first
    assert bool(learned) != measure_first, learned
    if learned:  # low's re-balancer's points, fitted per kind (a pace's unit, maybe, before)
        assert learned[0]["job"] == "low", learned
        kinds = {u["kind"]: u["line"] for u in learned if "kind" in u}
        assert kinds and all(line[1] > 0 for line in kinds.values()), learned
    assert rows["low"]["segments"] >= 2  # stopped at its checkpoint, resumed
    assert rows["low"]["moved_in_place"] == 0  # not elastic: moved by relaunch
    assert out["figures"]["steps_redone"] == 0
    spans = out["spans"]
    high_from = min(a for job, _, a, _ in spans if job == "high")
    low_until = max(b for job, _, _, b in spans if job == "low")
    assert high_from < low_until  # the high job ran before the low one had ended
    client = MlflowClient(MLflowTracker(TrackingConfig()).tracking_uri)
    parent = out["parent_run_id"]
    children = client.search_runs(
        [client.get_run(parent).info.experiment_id],
        f"tags.mlflow.parentRunId = '{parent}'",
    )
    assert sorted(r.info.run_name for r in children) == ["high", "low"]
    assert client.get_run(parent).data.params["measure_first"] == str(measure_first)
    assert "plots/queue_workers.png" in {a.path for a in client.list_artifacts(parent, "plots")}


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_fifo_runs_jobs_in_arrival_order_whatever_their_class(s3, prefect_harness, tmp_path):
    """Under `fifo` the first arrival takes the workers it asks for (both) and keeps them to
    its end; the high job behind it waits, then takes the first worker in the cluster's
    order: no move, nothing measured, the policy recorded on the session's run."""
    from mlflow.tracking import MlflowClient

    from hetflow.flows.job_queue import queue
    from hetflow.infra.tracking.tracker import MLflowTracker

    cluster = ClusterSpec.from_speeds([1, 2], time_scale=1.0, name="q2")
    common = {"recipe": "digits-mlp", "global_batch": 32, "checkpoint_every": 4}
    jobs = [
        QueueJob(name="first", priority="low", steps=8, workers=2, **common),
        QueueJob(name="high", priority="high", steps=4, workers=1, arrive_after_s=1, **common),
    ]
    out = queue(
        jobs=jobs,
        cluster=cluster,
        dataset=DatasetSpec(url="s3://hetflow-queue/digits", cache_dir=str(tmp_path / "c")),
        tracking=TrackingConfig(),
        switch_s=0.0,
        read_inbox=False,
        policy="fifo",
    )
    assert out["policy"] == "fifo"
    rows = {r["job"]: r for r in out["jobs"]}
    assert rows["first"]["segments"] == rows["high"]["segments"] == 1  # nothing moved
    assert out["figures"]["measuring_s"] == 0
    held = {job: sorted(w for j, w, _, _ in out["spans"] if j == job) for job in rows}
    assert held == {"first": ["w0", "w1"], "high": ["w0"]}
    first_until = max(b for job, _, _, b in out["spans"] if job == "first")
    assert min(a for job, _, a, _ in out["spans"] if job == "high") >= first_until
    assert rows["high"]["wait_s"] > 0
    client = MlflowClient(MLflowTracker(TrackingConfig()).tracking_uri)
    assert client.get_run(out["parent_run_id"]).data.params["policy"] == "fifo"
