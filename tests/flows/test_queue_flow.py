"""The queue as a user drives it: `hetflow queue submit` refuses bad jobs in one line and
leaves good ones in the inbox; the `queue` flow runs jobs of two classes on one emulated
cluster, the higher one taking workers at the lower one's checkpoint, each job's run nested
under the session's MLflow run with the plot of who held which worker."""

from __future__ import annotations

import pytest

from hetflow.cli import main
from hetflow.config import ClusterSpec, DatasetSpec, TrackingConfig
from hetflow.config.queue import QueueJob


def test_submit_refuses_an_unknown_class_and_a_job_no_worker_holds(capsys, hetflow_home):
    assert main(["queue", "submit", "a", "--priority", "urgent"]) == 2
    assert main(["queue", "submit", "a", "--memory-gb", "100"]) == 2
    err = capsys.readouterr().err.splitlines()
    assert err[0] == "hetflow: error: --priority: unknown class 'urgent'; one of high, normal, low"
    assert err[1].startswith("hetflow: error: --memory-gb: job 'a' needs 100 GB a worker; the ")
    assert not list((hetflow_home / "queue" / "inbox").glob("*.json"))


@pytest.mark.parametrize(
    "argv, said",
    [
        (["_x"], "NAME: a job name is letters, digits, '.', '_' and '-', starting with a letter"),
        (["a/b"], "NAME: a job name is letters, digits"),
        (["a", "--global-batch", "0"], "--global-batch: Input should be greater than or equal"),
        (["a", "--steps", "0"], "--steps: "),
        (["a", "--checkpoint-every", "0"], "--checkpoint-every: "),
        (["a", "--memory-gb", "-1"], "--memory-gb: "),
        (["a", "--arrive-after-s", "-1"], "--arrive-after-s: "),
        (["a", "--workers", "0"], "--workers: Input should be greater than or equal to 1"),
        (["a", "--recipe", "resnt"], "--recipe: unknown recipe 'resnt'; did you mean resnet?"),
    ],
)
def test_submit_names_the_flag_the_user_typed(capsys, hetflow_home, argv, said):
    assert main(["queue", "submit", *argv]) == 2
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 1 and err[0].startswith(f"hetflow: error: {said}"), err
    assert "^" not in err[0] and "_batch" not in err[0] and "memory_gb" not in err[0]


def test_list_says_so_where_no_job_was_queued(capsys, hetflow_home):
    assert main(["queue", "list"]) == 0
    assert capsys.readouterr().out.startswith("no job queued or run here yet: `hetflow queue")


def test_submit_leaves_the_job_in_the_inbox_and_list_shows_it(capsys, hetflow_home):
    assert main(["queue", "submit", "g", "--priority", "high", "--steps", "30"]) == 0
    job = QueueJob.model_validate_json((hetflow_home / "queue/inbox/g.json").read_text())
    assert (job.priority, job.steps, job.recipe) == ("high", 30, "digits-cnn")
    assert main(["queue", "submit", "g"]) == 2  # the name is taken
    assert main(["queue", "list"]) == 0
    header, row = capsys.readouterr().out.splitlines()[-2:]
    assert header.split() == ["JOB", "CLASS", "STATE", "STEPS", "ARRIVAL", "WORKERS", "REASON"]
    assert row.split()[:5] == ["g", "high", "queued", "0/30", "+0s"]


def test_submit_and_list_load_neither_the_flow_nor_its_services(hetflow_home):
    """A user's `submit` and `list` read and write the inbox: no Prefect or MLflow (`submit`
    imports the recipe, and so torch, to check it), and `list` not even torch."""
    import subprocess
    import sys

    code = (
        "import sys; from hetflow.cli import main; "
        "assert main(['queue', 'submit', 'a']) == 0; "
        "print(sorted(m for m in ('prefect', 'mlflow') if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.splitlines()[-1] == "[]"
    code = (
        "import sys; from hetflow.cli import main; assert main(['queue', 'list']) == 0; "
        "print(sorted(m for m in ('torch', 'prefect', 'mlflow') if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.splitlines()[-1] == "[]"
    assert (hetflow_home / "queue/inbox/a.json").exists()


def test_run_refuses_an_empty_inbox_and_bad_flags_before_the_session(capsys, hetflow_home):
    assert main(["queue", "run"]) == 2
    assert main(["queue", "submit", "a"]) == 0
    assert main(["queue", "run", "--time-scale", "-1"]) == 2
    assert main(["queue", "run", "--switch-s", "-3"]) == 2
    assert main(["queue", "run", "--policy", "fifi"]) == 2
    err = capsys.readouterr().err.splitlines()
    assert err[0].startswith("hetflow: error: queue: no job in the inbox: `hetflow queue submit")
    assert err[1].startswith("hetflow: error: --time-scale: ")
    assert err[2].startswith("hetflow: error: --switch-s: ")
    assert "--policy: invalid choice: 'fifi'" in err[3] and "did you mean fifo?" in err[3]
    assert len(err) == 4
    assert not (hetflow_home / "queue/cluster.json").exists()  # the next run's cluster


def test_run_hands_the_policy_to_the_flow_and_submit_the_workers_fifo_gives(
    hetflow_home, monkeypatch
):
    """`--policy fifo` reaches the session (the flow is replaced: its run is tested below);
    `submit --workers 2` is what FIFO gives the job."""
    import hetflow.flows.job_queue as flow

    got = {}

    def fake(**kw):
        got.update(kw)
        return {"figures": {}}

    monkeypatch.setattr(flow, "queue", fake)
    assert main(["queue", "submit", "a", "--workers", "2"]) == 0
    assert (
        QueueJob.model_validate_json((hetflow_home / "queue/inbox/a.json").read_text()).workers == 2
    )
    assert main(["queue", "run", "--policy", "fifo"]) == 0
    assert got["policy"] == "fifo"
    assert main(["queue", "run"]) == 0
    assert got["policy"] == "allocator"


def test_the_flow_refuses_a_session_with_no_job_before_its_services(hetflow_home):
    from hetflow.config import ConfigError
    from hetflow.flows.job_queue import queue

    with pytest.raises(ConfigError, match=r"^jobs: none given and none in the inbox"):
        queue.fn(jobs=[], read_inbox=False)


def test_the_inbox_hands_each_job_over_once(hetflow_home):
    from hetflow.tasks.queue import inbox_reader

    folder = hetflow_home / "inbox"
    folder.mkdir(parents=True)
    (folder / "a.json").write_text(QueueJob(name="a").model_dump_json())
    read = inbox_reader(folder)
    assert [j.name for j in read()] == ["a"] and read() == []
    assert inbox_reader(None)() == []


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_a_high_job_takes_workers_at_the_low_jobs_checkpoint(s3, prefect_harness, tmp_path):
    from mlflow.tracking import MlflowClient

    from hetflow.flows.job_queue import queue
    from hetflow.infra.tracking.tracker import MLflowTracker

    cluster = ClusterSpec.from_speeds([1, 2], time_scale=1.0, name="q2")
    jobs = [
        QueueJob(
            name="low",
            priority="low",
            recipe="digits-mlp",
            steps=8,
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
    )
    rows = {r["job"]: r for r in out["jobs"]}
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


def test_the_queue_form_takes_its_defaults_and_refuses_an_unknown_class():
    from prefect.utilities.callables import parameter_schema
    from prefect.utilities.schema_tools import ValidationError, validate

    from hetflow.flows.job_queue import queue

    schema = parameter_schema(queue.fn).model_dump_for_openapi()
    defaults = {k: p["default"] for k, p in schema["properties"].items() if "default" in p}
    validate(defaults, schema, raise_on_error=True)
    ran = queue.validate_parameters(defaults)
    assert ran["job"].name == defaults["job"]["name"] and ran["jobs"] == []  # one job
    with pytest.raises(ValidationError, match="urgent"):
        validate({"job": {"name": "a", "priority": "urgent"}}, schema, raise_on_error=True)


@pytest.mark.parametrize(
    "progress, expected", [(0, 20), (17, 20), (18, 20), (19, 40), (20, 40), (38, 40), (39, None)]
)
def test_a_move_stops_the_run_at_a_checkpoint_no_rank_has_reached(progress, expected):
    """Two steps past the step progress.json says (a rank may be one ahead), on a boundary;
    none where the job ends first."""
    from hetflow.queue.jobs import Job
    from hetflow.tasks.queue_session import Live

    job = QueueJob(name="j", steps=50, checkpoint_every=20)
    live = Live(job, Job("j", "normal", 128, 50, 1.0, checkpoint_every=20), 0.0)
    assert live.stop_step(progress) == expected
