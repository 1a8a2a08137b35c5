"""The queue's moves in place: a job that runs elastic (`QueueJob.in_place`) gives a worker to
another at a step boundary, without a stop at a checkpoint or a relaunch; its MLflow run shows
the change of membership; a job that does not run elastic still moves by relaunch."""

from __future__ import annotations

import json

import pytest

from hetflow.config import ClusterSpec, DatasetSpec, TrackingConfig
from hetflow.config.queue import QueueJob
from hetflow.tasks.queue_moves import Moves
from hetflow.training.launch.live import registered


class FakeMembers:
    """A running elastic job's membership, its ranks' processes ending when told to."""

    def __init__(self, names: list[str]) -> None:
        self.names, self.released, self.ended = names, [], set()

    def release(self, rank: int) -> None:
        self.released.append(rank)

    def gone(self, rank: int) -> bool:
        return rank in self.ended

    def rank_of(self, worker: str) -> int | None:
        return self.names.index(worker) if worker in self.names else None


def test_a_shrink_releases_the_workers_given_up_and_frees_them_once_gone(tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    (run / "progress.json").write_text(json.dumps({"step": 5}))
    members = FakeMembers(["w0", "w1", "w2"])
    moves = Moves(default_s=2.0)
    with registered(run, members):
        assert not moves.shrink("a", run, ["w0", "w1"], ["w0", "w1", "w2"], 0.0)  # grows
        assert not moves.shrink("a", run, ["w0", "w1"], [], 0.0)  # gives up all
        assert not moves.shrink("a", tmp_path / "other", ["w0", "w1"], ["w0"], 0.0)  # not live
        assert members.released == []
        assert moves.shrink("a", run, ["w0", "w1", "w2"], ["w1"], 10.0)
        assert members.released == [0, 2]
        assert moves.busy() == {"w0", "w2"}
        assert moves.settle(10.5) == [] and moves.busy() == {"w0", "w2"}
        members.ended |= {0, 2}
        assert {m.worker for m in moves.settle(11.0)} == {"w0", "w2"}
        assert moves.busy() == set() and moves.cost_s == 2.0  # not stepping again yet
        (run / "progress.json").write_text(json.dumps({"step": 6}))
        moves.settle(11.5)
    assert moves.leaving == [] and moves.cost_s == 1.5  # request to the job stepping again
    assert moves.count("a") == 2


def test_a_job_not_stepping_yet_is_not_shrunk_in_place(tmp_path):
    members = FakeMembers(["w0", "w1"])
    with registered(tmp_path, members):
        assert not Moves(1.0).shrink("a", tmp_path, ["w0", "w1"], ["w0"], 0.0)
    assert members.released == []


def two_jobs(in_place: bool) -> list[QueueJob]:
    common = {"recipe": "digits-mlp", "global_batch": 32, "checkpoint_every": 20}
    return [
        QueueJob(name="low", priority="low", steps=60, in_place=in_place, **common),
        QueueJob(name="high", priority="high", steps=8, arrive_after_s=1, **common),
    ]


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_a_move_in_place_shrinks_the_giving_job_without_a_relaunch(s3, prefect_harness, tmp_path):
    """`low` (elastic) holds both workers; `high` arrives and the allocator gives it one of
    them, at a relaunch's price far above what the move gains, but in place: `low` lets the
    worker go at a step and goes on with one launch, no step redone, every step once; its
    MLflow run records the change of membership; `high` started before `low`'s checkpoint."""
    from mlflow.tracking import MlflowClient

    from hetflow.flows.job_queue import queue
    from hetflow.infra.paths import runs_dir
    from hetflow.infra.tracking.tracker import MLflowTracker

    out = queue(
        jobs=two_jobs(in_place=True),
        cluster=ClusterSpec.from_speeds([1, 2], time_scale=1.0, name="q2"),
        dataset=DatasetSpec(url="s3://hetflow-queue/digits", cache_dir=str(tmp_path / "c")),
        tracking=TrackingConfig(),
        switch_s=600.0,
        in_place_s=0.1,
        read_inbox=False,
    )
    rows = {r["job"]: r for r in out["jobs"]}
    assert rows["low"]["segments"] == 1  # one launch: no stop, no relaunch
    assert rows["low"]["moved_in_place"] == 1
    assert out["figures"]["steps_redone"] == 0
    assert 0 < out["figures"]["in_place_s"] < 600.0  # measured
    (result,) = runs_dir().glob("*-low/result.json")
    steps = [s["step"] for s in json.loads(result.read_text())["ranks"][0]["records"]]
    assert steps == list(range(60))  # every step once, none redone
    client = MlflowClient(MLflowTracker(TrackingConfig()).tracking_uri)
    parent = out["parent_run_id"]
    children = client.search_runs(
        [client.get_run(parent).info.experiment_id], f"tags.mlflow.parentRunId = '{parent}'"
    )
    (low,) = [r for r in children if r.info.run_name == "low"]
    path = client.download_artifacts(low.info.run_id, "membership.json", str(tmp_path))
    (change,) = json.loads(open(path).read())
    assert len(change["lost"]) == 1 and change["world"] == 1 and 0 < change["step"] < 60
    assert client.get_metric_history(low.info.run_id, "membership.world")[-1].value == 1
    high_from = min(a for job, _, a, _ in out["spans"] if job == "high")
    low_until = max(b for job, _, _, b in out["spans"] if job == "low")
    assert high_from < low_until
