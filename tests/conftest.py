"""Shared fixtures: a private HETFLOW_HOME, an S3 endpoint over HTTP (moto), Prefect's harness.

Every test that touches S3 talks HTTP to a moto server on 127.0.0.1, as s3fs's own tests do.
"""

from __future__ import annotations

import json
import logging
import os

import pytest

from tests.fake_credentials import SECRETS
from tests.procs import run_cli

os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
os.environ.setdefault("PREFECT_LOGGING_LEVEL", "WARNING")


@pytest.fixture(autouse=True)
def hetflow_home(tmp_path, monkeypatch):
    home = tmp_path / "hetflow-home"
    monkeypatch.setenv("HETFLOW_HOME", str(home))
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    return home


@pytest.fixture(scope="session")
def s3_server():
    """A moto S3/EC2 server on loopback for the whole session; yields its endpoint URL."""
    from moto.server import ThreadedMotoServer

    logging.getLogger("werkzeug").setLevel(logging.ERROR)
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    yield f"http://{host}:{port}"
    server.stop()


@pytest.fixture
def s3(s3_server, monkeypatch):
    """Point boto3/s3fs (and torchrun children) at the moto server with fake credentials."""
    monkeypatch.setenv("AWS_ENDPOINT_URL", s3_server)
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing-key-id")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing-secret")
    monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")
    return s3_server


@pytest.fixture
def digits(s3, tmp_path, request):
    """scikit-learn's digits written as shards to the S3 endpoint, in a bucket named after the
    test module; returns the DatasetSpec, with a cache of the test's own."""
    from hetflow.config import DatasetSpec
    from hetflow.infra.data.format import digits_source, write_dataset

    bucket = "hetflow-" + request.module.__name__.rsplit(".", 1)[-1].removeprefix("test_").replace(
        "_", "-"
    )
    spec = DatasetSpec(url=f"s3://{bucket}/digits", cache_dir=str(tmp_path / "cache"))
    write_dataset(spec.url, digits_source(spec.test_fraction, spec.seed), spec.shard_samples)
    return spec


@pytest.fixture
def local_digits(tmp_path):
    """Digits as shards in a folder (the forked ranks need no S3 endpoint)."""
    from hetflow.config import DatasetSpec
    from hetflow.infra.data.format import digits_source, write_dataset

    (tmp_path / "digits" / "train").mkdir(parents=True)
    (tmp_path / "digits" / "test").mkdir()
    spec = DatasetSpec(url=(tmp_path / "digits").as_uri(), cache_dir=str(tmp_path / "cache"))
    write_dataset(spec.url, digits_source(spec.test_fraction, spec.seed), spec.shard_samples)
    return spec


@pytest.fixture(scope="session")
def prefect_harness():
    from prefect.testing.utilities import prefect_test_harness

    with prefect_test_harness(server_startup_timeout=120):
        yield


@pytest.fixture(scope="session")
def demo(tmp_path_factory):
    """`hetflow demo --speeds 1,1,2,4 --steps 30` as a user with AWS credentials runs it: the
    fake `SECRETS` in the environment and nothing else configured. (home, the --json table,
    stdout); stdout and stderr are also kept in home/demo.out for test_secrets.py to scan."""
    home = tmp_path_factory.mktemp("demo-home")
    out = home / "demo.json"
    env = {
        k: v for k, v in os.environ.items() if not k.startswith(("AWS_", "MLFLOW_", "PREFECT_API"))
    }
    env.update(
        HETFLOW_HOME=str(home),
        PREFECT_HOME=str(home / "prefect"),
        PREFECT_SERVER_ANALYTICS_ENABLED="false",
        PREFECT_LOGGING_LEVEL="INFO",  # as a user sees it; the flow runs' logs reach Prefect's DB
        **SECRETS,
    )
    args = ["demo", "--speeds", "1,1,2,4", "--steps", "30", "--json", str(out)]
    proc = run_cli(args, env, timeout=400)
    (home / "demo.out").write_text(proc.stdout + proc.stderr)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return home, json.loads(out.read_text()), proc.stdout


_FAULT_ROWS: list[tuple] = []


class _FaultRows:
    """Rows a test adds to the fault-injection report. They travel on the test's report
    (`user_properties`), so they reach the summary from pytest-xdist's workers too."""

    def __init__(self, item) -> None:
        self.item = item

    def append(self, row: tuple) -> None:
        self.item.user_properties.append(("fault_row", tuple(row)))


@pytest.fixture
def fault_table(request):
    """Rows (fault, where, outcome, steps redone, data lost, faults injected) for the report."""
    return _FaultRows(request.node)


def pytest_runtest_logreport(report):
    if report.when == "call":
        _FAULT_ROWS.extend(tuple(v) for k, v in report.user_properties if k == "fault_row")


def pytest_terminal_summary(terminalreporter):
    if not _FAULT_ROWS:
        return
    tr = terminalreporter
    tr.section("fault injection")
    header = ("fault injected", "during", "job", "steps redone", "data lost", "faults")
    rows = [header, *[tuple(str(c) for c in r) for r in _FAULT_ROWS]]
    widths = [max(len(r[i]) for r in rows) for i in range(len(header))]
    for r in rows:
        tr.write_line(" | ".join(c.ljust(w) for c, w in zip(r, widths)))
