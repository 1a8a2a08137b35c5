"""The queue as a user drives it: `hetflow queue submit` refuses bad jobs in one line and
leaves good ones in the inbox; the `queue` flow runs jobs of two classes on one emulated
cluster, the higher one taking workers at the lower one's checkpoint, each job's run nested
under the session's MLflow run with the plot of who held which worker."""

from __future__ import annotations

import pytest

from hetflow.cli import main
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
    from hetflow.tasks.queue_live import Live

    job = QueueJob(name="j", steps=50, checkpoint_every=20)
    live = Live(job, Job("j", "normal", 128, 50, 1.0, checkpoint_every=20), 0.0)
    assert live.stop_step(progress) == expected
