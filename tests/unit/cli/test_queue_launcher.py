"""`hetflow queue run --launcher/--ray-address`: refused in one line naming the flag before the
session starts (no Ray cluster, an address without the Ray launcher, an unknown launcher),
and the launcher chosen handed to the queue flow on the cluster it runs."""

from __future__ import annotations

import pytest

from hetflow.cli import main


@pytest.mark.parametrize(
    "argv, said",
    [
        (["--ray-address", "127.0.0.1:6379"], "--ray-address: needs --launcher ray"),
        (["--address", "127.0.0.1:6379"], "--ray-address: needs --launcher ray"),
        (
            ["--launcher", "ray", "--ray-address", "127.0.0.1:1"],
            "--ray-address: no Ray cluster answers at 127.0.0.1:1: ",
        ),
        (["--launcher", "slurm"], "--launcher: invalid choice: 'slurm'"),
    ],
)
def test_run_refuses_a_bad_launcher_in_one_line_before_the_session(
    capsys, hetflow_home, monkeypatch, argv, said
):
    import hetflow.flows.job_queue as flow

    monkeypatch.setattr(flow, "queue", lambda **kw: pytest.fail("the session started"))
    assert main(["queue", "submit", "a"]) == 0
    capsys.readouterr()
    assert main(["queue", "run", *argv]) == 2
    err = capsys.readouterr().err.splitlines()
    errors = [line for line in err if line.startswith("hetflow: error:")]
    assert len(errors) == 1 and said in errors[0], err
    assert "Traceback" not in "\n".join(err)
    assert not (hetflow_home / "queue/cluster.json").exists()  # the next run's cluster


def test_run_hands_the_launcher_on_the_cluster_to_the_flow(hetflow_home, monkeypatch, tmp_path):
    """`--launcher local` over a cluster file that says ray; the file's own launcher where no
    flag is given (its Ray cluster checked first: here, none answers)."""
    import hetflow.flows.job_queue as flow

    got = {}

    def fake(**kw):
        got.update(kw)
        return {"figures": {}}

    monkeypatch.setattr(flow, "queue", fake)
    cluster = tmp_path / "ray.yaml"
    cluster.write_text(
        "launcher: ray\nray_address: 127.0.0.1:1\nworkers:\n  - {name: a, speed: 1}\n"
    )
    assert main(["queue", "submit", "a"]) == 0
    assert main(["queue", "run", "--cluster", str(cluster), "--launcher", "local"]) == 0
    assert got["cluster"].launcher == "local"
    assert main(["queue", "run", "--cluster", str(cluster)]) == 2  # ray: none at its address


def test_the_queue_form_offers_the_launcher_and_defaults_to_the_clusters():
    from prefect.utilities.callables import parameter_schema

    from hetflow.flows.job_queue import queue

    prop = parameter_schema(queue.fn).model_dump_for_openapi()["properties"]["launcher"]
    assert (prop["enum"], prop["default"], prop["title"]) == (
        ["cluster", "local", "ray"],
        "cluster",
        "Launcher",
    )
    assert queue.validate_parameters({"launcher": "ray"})["launcher"] == "ray"
