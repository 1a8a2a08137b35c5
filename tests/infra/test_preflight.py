"""A dead endpoint ends a run at once, in one line naming it and what to set, before anything is
written: from the command line (`hetflow demo`, a subprocess, as a user runs it) and inside a
flow (its first task fails; no dataset is written, no worker launched)."""

from __future__ import annotations

import asyncio
import os
import subprocess
import time

import pytest

from hetflow.infra.s3 import free_port

from tests.procs import run_cli

pytestmark = pytest.mark.timeout(120)

DEAD = "http://127.0.0.1:9"  # the discard port: nothing listens there
CASES = {
    "S3": ("AWS_ENDPOINT_URL", DEAD),
    "MLflow": ("MLFLOW_TRACKING_URI", DEAD),
    "Prefect": ("PREFECT_API_URL", f"{DEAD}/api"),
}


def _hetflow(home, extra: dict[str, str], *args: str) -> tuple[subprocess.CompletedProcess, float]:
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("AWS_", "MLFLOW_", "PREFECT_API", "HTTP_PROXY", "HTTPS_PROXY"))
    }
    env.update(HETFLOW_HOME=str(home), PREFECT_HOME=str(home / "prefect"), **extra)
    t = time.perf_counter()
    proc = run_cli(list(args), env, timeout=120)
    return proc, time.perf_counter() - t


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


def test_an_endpoint_that_answers_without_credentials_is_named(s3_server, tmp_path):
    """An S3 endpoint that answers, and no credential to sign with: s3fs would retry unsigned
    requests for a minute; the check says what to set instead."""
    proc, _ = _hetflow(
        tmp_path / "home", {"AWS_ENDPOINT_URL": s3_server}, "data", "ingest", "--url", "s3://x/y"
    )
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert proc.returncode != 0 and len(lines) == 1, proc.stderr
    assert s3_server in lines[0] and "AWS_ACCESS_KEY_ID" in lines[0]


@pytest.mark.slow
def test_a_flow_with_a_dead_mlflow_fails_at_its_first_task_before_writing(
    s3, prefect_harness, tmp_path, hetflow_home, fault_table
):
    """The compare flow (as a deployment runs it) given a tracking URI nobody serves: the
    flow run fails in its first task with the one line; no dataset, no run directory."""
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterId

    from hetflow.config import ClusterSpec, DatasetSpec, TrackingConfig, TrainConfig
    from hetflow.flows.compare import compare
    from hetflow.infra.s3 import filesystem

    dead = f"http://127.0.0.1:{free_port()}"
    dataset = DatasetSpec(url="s3://hetflow-preflight/digits", cache_dir=str(tmp_path / "c"))
    state = compare(
        cluster=ClusterSpec.from_speeds([1, 2]),
        dataset=dataset,
        train=TrainConfig(recipe="digits-mlp", steps=5, global_batch=32),
        tracking=TrackingConfig(tracking_uri=dead),
        return_state=True,
    )
    assert state.is_failed()
    assert f"MLflow {dead} (tracking.tracking_uri) cannot be reached" in state.message
    assert "\n" not in state.message

    async def task_names() -> list[str]:
        async with get_client() as client:
            runs = await client.read_task_runs(
                flow_run_filter=FlowRunFilter(
                    id=FlowRunFilterId(any_=[state.state_details.flow_run_id])
                )
            )
        return [r.name for r in runs]

    assert asyncio.run(task_names()) == ["check services"]
    fs, root = filesystem(dataset.url)
    assert not fs.exists(f"{root}/manifest.json")
    assert not (hetflow_home / "runs").exists()
    fault_table.append(
        (
            "dead MLflow (tracking.tracking_uri)",
            "compare flow",
            "failed at its first task",
            0,
            "none",
            1,
        )
    )


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
