"""A dead endpoint ends a run at once, in one line naming it and what to set, before anything is
written: from the command line (`hetflow demo`, a subprocess, as a user runs it) and inside a
flow (its first task fails; no dataset is written, no worker launched)."""

from __future__ import annotations

import pytest

from tests.helpers.infra.preflight import _hetflow

pytestmark = pytest.mark.timeout(120)


DEAD = "http://127.0.0.1:9"  # the discard port: nothing listens there


CASES = {
    "S3": ("AWS_ENDPOINT_URL", DEAD),
    "MLflow": ("MLFLOW_TRACKING_URI", DEAD),
    "Prefect": ("PREFECT_API_URL", f"{DEAD}/api"),
}


@pytest.mark.parametrize("service", list(CASES))
def test_demo_with_a_dead_endpoint_ends_in_one_line_naming_it(service, tmp_path, fault_table):
    var, url = CASES[service]
    home = tmp_path / "home"
    proc, took = _hetflow(home, {var: url}, "demo", "--speeds", "1,2", "--steps", "5")
    print(f"{service}: hetflow demo ended in {took:.1f}s: {proc.stderr.strip()}")
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert proc.returncode != 0
    assert len(lines) == 1, proc.stderr
    assert lines[0].startswith("hetflow: error: ") and url in lines[0] and var in lines[0]
    assert "connection refused" in lines[0]
    assert "Traceback" not in proc.stdout + proc.stderr
    # nothing was started or written: no run directory, no MLflow store, no Prefect database
    written = [p for p in home.rglob("*") if p.is_file()] if home.exists() else []
    assert not written, written
    fault_table.append(
        (f"dead {service} ({var})", "hetflow demo", f"ended: one line, {took:.1f}s", 0, "none", 1)
    )


@pytest.mark.parametrize(
    "var, args",
    [
        ("MLFLOW_TRACKING_URI", ("compare", "a" * 32, "b" * 32)),
        ("AWS_ENDPOINT_URL", ("data", "ingest", "--url", "s3://mine/digits")),
        ("PREFECT_API_URL", ("profile", "--speeds", "1,2")),
    ],
    ids=["compare", "data-ingest", "profile"],
)
def test_other_commands_with_a_dead_endpoint_end_in_one_line(var, args, tmp_path):
    url = f"{DEAD}/api" if var == "PREFECT_API_URL" else DEAD
    proc, _ = _hetflow(tmp_path / "home", {var: url}, *args)
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert proc.returncode != 0 and len(lines) == 1, proc.stderr
    assert lines[0].startswith("hetflow: error: ") and f"{url} ({var})" in lines[0]


def test_every_dead_endpoint_is_named_in_the_one_line(tmp_path):
    extra = {var: url for var, url in CASES.values()}
    proc, _ = _hetflow(tmp_path / "home", extra, "train", "--speeds", "1,2", "--steps", "5")
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert proc.returncode != 0 and len(lines) == 1, proc.stderr
    assert all(var in lines[0] for var in ("AWS_ENDPOINT_URL", "MLFLOW_TRACKING_URI"))
    assert "PREFECT_API_URL" in lines[0]


def test_an_endpoint_that_accepts_and_never_answers_is_named_after_the_timeout():
    """A server that accepts connections and never answers (a hung process, a firewall that
    swallows requests) is named after the check's timeout, not after the clients' retries."""
    import socket

    from hetflow.config import TrackingConfig
    from hetflow.infra.preflight import TIMEOUT_S, ServiceUnreachable, check_services

    with socket.socket() as silent:
        silent.bind(("127.0.0.1", 0))
        silent.listen(8)  # the kernel completes the handshake; nobody reads the request
        url = f"http://127.0.0.1:{silent.getsockname()[1]}"
        with pytest.raises(ServiceUnreachable) as e:
            check_services(tracking=TrackingConfig(tracking_uri=url))
    assert str(e.value).startswith(f"MLflow {url} (tracking.tracking_uri) cannot be reached")
    assert f"no answer in {TIMEOUT_S:g} s" in str(e.value) and "\n" not in str(e.value)
