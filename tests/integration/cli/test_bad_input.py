"""Bad input gets one clear line naming the field, and nothing is launched."""

from __future__ import annotations

import os

import pytest

from tests.helpers.cli.bad_input import _hetflow


def test_a_missing_bucket_is_one_line(tmp_path, s3):
    line = _hetflow(tmp_path, "demo", "--dataset-url", "s3://no-such-bucket-hf/x", s3=s3)
    assert "s3://no-such-bucket-hf: no such bucket" in line
    assert "hetflow data ingest --to s3://no-such-bucket-hf/x" in line


def test_an_unknown_ray_instance_type_is_one_line_without_a_ray_cluster(tmp_path, s3):
    from hetflow.infra.s3 import free_port

    cluster = tmp_path / "ray.yaml"
    cluster.write_text(
        "launcher: ray\nworkers:\n"
        "  - {name: a, instance_type: g5.xlarge}\n  - {name: b, instance_type: x9.nonesuch}\n"
    )
    # an address where no Ray cluster answers: the type is refused before Ray is asked
    address = f"127.0.0.1:{free_port()}"
    line = _hetflow(tmp_path, "demo", "--cluster", str(cluster), "--ray-address", address, s3=s3)
    assert "instance_type" in line and "x9.nonesuch" in line and "g5.xlarge" not in line


# A user error raised inside a flow, by the `hetflow demo` command's own path (`main`,
# `commands.start_flow_logs`): the flow stands in for one whose check can only run inside it.
IN_A_FLOW = """
import sys
from hetflow.cli import commands, main
from hetflow.config import ConfigError

def cmd_demo(args):
    commands.start_flow_logs(args)  # before Prefect is imported, as the commands do
    from prefect import flow, task

    @task(retries=1)
    def ingest():
        raise ConfigError("dataset.url: the bad value, in one line")

    @flow
    def compare():
        ingest()

    compare()

commands.cmd_demo = cmd_demo
sys.argv = ["hetflow", "demo"]
sys.exit(main())
"""


@pytest.mark.slow
def test_a_user_error_inside_a_flow_is_one_line_and_its_traceback_is_in_the_log(tmp_path):
    import subprocess
    import sys

    home = tmp_path / "home"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PREFECT_API", "PREFECT_LOG"))}
    env.update(
        HETFLOW_HOME=str(home),
        PREFECT_HOME=str(home / "prefect"),
        PREFECT_LOGGING_LEVEL="INFO",  # as a user sees it
        PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS="120",  # a loaded test host
    )
    proc = subprocess.run(
        [sys.executable, "-c", IN_A_FLOW], env=env, capture_output=True, text=True, timeout=240
    )
    out = proc.stdout + proc.stderr
    errors = [line for line in out.splitlines() if "hetflow: error:" in line]
    assert proc.returncode == 2, out
    assert len(errors) == 1 and "dataset.url: the bad value, in one line" in errors[0], out
    assert "Traceback" not in out and "ConfigError" not in out, out
    assert "Beginning flow run" in out  # the flow's progress still shows
    log = home / "logs" / errors[0].rsplit("(traceback in ", 1)[1].rstrip(")").rsplit("/", 1)[1]
    text = log.read_text()
    assert "Traceback" in text and "ConfigError: dataset.url: the bad value" in text
    assert "Finished in state Failed" in text  # Prefect's records of the failure, kept there
