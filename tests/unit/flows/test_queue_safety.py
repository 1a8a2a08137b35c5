"""One bad job never takes the queue down: `hetflow queue submit` refuses, in one line naming
the flag, a job that could not run (its recipe, its data); a job that fails at run time ends
alone, `failed` with its reason in `queue list`, Prefect and MLflow, while the others run to
their end; `hetflow queue cancel` takes a queued job out and stops a running one at its next
checkpoint."""

from __future__ import annotations

import json

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
    from hetflow.tasks.queue_live import Live

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
