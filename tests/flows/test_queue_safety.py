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
from hetflow.config.queue import CANCEL_FOLDER, QueueJob


def inbox(home):
    return sorted(p.name for p in (home / "queue" / "inbox").glob("*.json"))


@pytest.mark.parametrize(
    "argv, said",
    [
        (
            ["--recipe", "mypkg.missing:Model"],
            "--recipe: 'mypkg.missing:Model' does not import (No module named 'mypkg')",
        ),
        (["--recipe", "tests.queue_recipes:Nope"], "--recipe: module 'tests.queue_recipes' has"),
        (
            ["--recipe", "gpt"],
            "--recipe: gpt reads tokens samples, but s3://hetflow-data/digits (digits) holds "
            "tabular samples",
        ),
    ],
)
def test_submit_refuses_a_recipe_that_cannot_run_naming_the_flag(capsys, hetflow_home, argv, said):
    assert main(["queue", "submit", "broken", *argv]) == 2
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 1 and err[0].startswith(f"hetflow: error: {said}"), err
    assert inbox(hetflow_home) == []


def test_submit_refuses_a_dataset_it_cannot_reach(capsys, hetflow_home, monkeypatch):
    monkeypatch.setenv("AWS_ENDPOINT_URL", "http://127.0.0.1:9")  # nothing listens (discard)
    assert main(["queue", "submit", "a", "--recipe", "digits-mlp"]) == 2
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 1, err
    assert err[0].startswith("hetflow: error: S3 endpoint http://127.0.0.1:9 (AWS_ENDPOINT_URL)")
    assert inbox(hetflow_home) == []


def test_a_field_a_check_names_is_said_as_the_submit_flag():
    from hetflow.cli.queue import SUBMIT_FLAGS
    from hetflow.cli.queue_checks import by_flag
    from hetflow.config import ConfigError

    def said(message: str) -> str:
        return str(by_flag(ConfigError(message), SUBMIT_FLAGS))

    assert said("train.global_batch: 3 is smaller") == "--global-batch: 3 is smaller"
    assert said("train.lr_scaling: no rule") == "--recipe: no rule"
    assert said("cluster.workers[w0].device: no cuda") == "cluster.workers[w0].device: no cuda"


def test_cancel_takes_a_queued_job_out_and_refuses_a_name_it_does_not_know(capsys, hetflow_home):
    assert main(["queue", "submit", "a", "--recipe", "digits-mlp", "--steps", "8"]) == 0
    assert main(["queue", "submit", "b", "--recipe", "digits-mlp", "--steps", "8"]) == 0
    assert main(["queue", "cancel", "a"]) == 0
    assert inbox(hetflow_home) == ["b.json"]
    assert main(["queue", "cancel", "a"]) == 2  # gone: no longer known
    assert main(["queue", "cancel", "../inbox/b"]) == 2  # a name, never a path
    out, err = capsys.readouterr()
    assert "cancelled a: taken out of the queue before it ran" in out
    assert err.splitlines() == [
        "hetflow: error: NAME: no job 'a' in the queue (`hetflow queue list` names them)",
        "hetflow: error: NAME: '../inbox/b' is no job's name (`hetflow queue list` names them)",
    ]
    assert inbox(hetflow_home) == ["b.json"]


def write_state(home, rows: list[dict]) -> None:
    base = {"priority": "normal", "workers": [], "steps_done": 0, "steps": 8, "arrived_s": 0.0}
    (home / "queue").mkdir(parents=True, exist_ok=True)
    (home / "queue" / "state.json").write_text(json.dumps([base | r for r in rows]))


def test_list_shows_each_jobs_state_and_why_it_failed(capsys, hetflow_home):
    write_state(
        hetflow_home,
        [
            {"name": "ok", "state": "done", "steps_done": 8},
            {"name": "bad", "state": "failed", "reason": "rank 0 (step 4): RuntimeError: boom"},
        ],
    )
    assert main(["queue", "list"]) == 0
    header, ok, bad = capsys.readouterr().out.splitlines()
    assert header.split()[-2:] == ["WORKERS", "REASON"]
    assert ok.split()[2] == "done"
    assert bad.split()[2] == "failed" and bad.endswith("rank 0 (step 4): RuntimeError: boom")


def test_run_exits_1_where_a_job_of_the_session_failed(capsys, hetflow_home):
    from hetflow.cli.queue import failures_said

    write_state(
        hetflow_home,
        [{"name": "ok", "state": "done"}, {"name": "c", "state": "cancelled"}],
    )
    assert failures_said(hetflow_home / "queue") == 0
    write_state(hetflow_home, [{"name": "bad", "state": "failed", "reason": "rank 0: boom"}])
    assert failures_said(hetflow_home / "queue") == 1
    assert capsys.readouterr().err == "hetflow: job bad failed: rank 0: boom\n"


def test_cancel_asks_the_session_to_end_a_job_it_runs_and_refuses_an_ended_one(
    capsys, hetflow_home
):
    write_state(
        hetflow_home,
        [{"name": "run", "state": "running", "workers": ["w0"]}, {"name": "ok", "state": "done"}],
    )
    assert main(["queue", "cancel", "run"]) == 0
    assert (hetflow_home / "queue" / CANCEL_FOLDER / "run").exists()
    assert main(["queue", "cancel", "ok"]) == 2
    out, err = capsys.readouterr()
    assert out.startswith("cancelling run: it stops at its next checkpoint")
    assert err.splitlines() == ["hetflow: error: NAME: job 'ok' has already ended (done)"]


def session(home):
    """A session on two workers, without Prefect (nothing here starts a segment)."""
    from hetflow.tasks.queue_session import Session

    cluster = ClusterSpec.from_speeds([1, 2], name="q2")
    return Session(
        cluster,
        DatasetSpec(),
        TrackingConfig(),
        "parent",
        0.0,
        lambda: [],
        state=home / "state.json",
        cancels=home / CANCEL_FOLDER,
    )


def test_the_session_ends_a_job_cancelled_before_it_arrived_or_while_it_waits(hetflow_home):
    from hetflow.queue.jobs import Job
    from hetflow.tasks.queue_session import Live

    hetflow_home.mkdir(parents=True, exist_ok=True)
    (hetflow_home / CANCEL_FOLDER).mkdir()
    (hetflow_home / CANCEL_FOLDER / "stale").touch()  # from an earlier session: dropped
    s = session(hetflow_home)
    s.pending = [QueueJob(name="later", arrive_after_s=60), QueueJob(name="stale")]
    s.jobs = [Live(QueueJob(name="wait"), Job("wait", "normal", 128, 60, 0.5), 0.0)]
    for name in ("later", "wait"):
        (hetflow_home / CANCEL_FOLDER / name).touch()
    assert s.take_cancels()
    assert [q.name for q in s.pending] == ["stale"]
    states = {j.job.name: (j.state, j.reason) for j in s.jobs}
    assert states == {
        "wait": ("cancelled", "cancelled while waiting, at step 0"),
        "later": ("cancelled", "cancelled before it arrived"),
    }
    assert s.active() == [] and not list((hetflow_home / CANCEL_FOLDER).iterdir())


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


def test_every_rank_stops_at_the_same_checkpoint_however_late_the_request_comes(tmp_path):
    """Rank 1 runs a step ahead of rank 0 and asks about boundary 112 before the queue writes
    `stop_at` = 112: rank 0, which reads the file, moves the stop to the next checkpoint no
    rank has asked about, and both stop there (a rank stopping alone waits in a collective)."""
    import torch.distributed as dist

    from hetflow.training.loop.progress import STOP_FILE
    from hetflow.training.loop.stop_request import StopRequest

    store = dist.HashStore()
    rank0, rank1 = (StopRequest(tmp_path, r, every=4, slack=1, store=store) for r in (0, 1))
    assert not rank1.asked(111) and not rank1.asked(112)
    (tmp_path / STOP_FILE).write_text("112")
    stops = {0: [], 1: []}
    for boundary in range(112, 121):
        stops[0].append(rank0.asked(boundary))
        stops[1].append(rank1.asked(boundary + 1) if boundary < 120 else False)
    assert [112 + i for i, s in enumerate(stops[0]) if s] == [116]
    assert [113 + i for i, s in enumerate(stops[1]) if s] == [116]
