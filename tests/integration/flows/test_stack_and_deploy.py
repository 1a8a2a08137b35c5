"""The persistent local stack and the deployments of prefect.yaml, end to end on 127.0.0.1.

`hetflow stack up` (a subprocess, as a user runs it) in a private HETFLOW_HOME on free ports;
S3, MLflow (artifacts in the stack's S3) and Prefect answer; `prefect deploy --all` succeeds;
a run of `prepare-dataset`, created through the API as the UI does, is executed by a process
worker and writes its manifest to the stack's S3; the server's scheduler creates runs of the
scheduled deployments; `down` closes the ports and the S3 state survives a restart; and the
Prefect and MLflow servers' logs hold no errors at the end. A few minutes on 2 cores.
"""

from __future__ import annotations

import json
import os
import re
import socket
import subprocess
import sys
import time
import urllib.request
import uuid
from pathlib import Path

import pytest
import yaml

from hetflow.infra.s3 import free_port

from tests.run_metrics import FRACTIONS, RUN_METRICS

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]

REPO = Path(__file__).resolve().parents[3]
CLIENT_VARS = (
    "PREFECT_API_URL",
    "PREFECT_API_KEY",
    "MLFLOW_TRACKING_URI",
    "AWS_ENDPOINT_URL",
    "AWS_ACCESS_KEY_ID",
    "AWS_SECRET_ACCESS_KEY",
    "AWS_SESSION_TOKEN",
    "AWS_PROFILE",
)
S3_PROBE = ("hetflow-stack-test", "probe/hello.txt", b"hello from the stack test")


def _cli(env: dict, *args: str, timeout: float = 240) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "hetflow.cli", *args],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


def _exports(stdout: str) -> dict[str, str]:
    out = {}
    for line in stdout.splitlines():
        if line.startswith("export "):
            k, _, v = line.removeprefix("export ").partition("=")
            out[k] = v
    return out


def _answers(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=5) as r:
            return 200 <= r.status < 300
    except OSError:
        return False


def _port_open(port: int) -> bool:
    with socket.socket() as s:
        s.settimeout(1)
        return s.connect_ex(("127.0.0.1", port)) == 0


def _listen_addresses(port: int) -> set[str]:
    """Local addresses (hex, as in /proc/net/tcp*) of the sockets listening on `port`."""
    found = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            lines = Path(table).read_text().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            local, state = line.split()[1], line.split()[3]
            addr, _, p = local.partition(":")
            if state == "0A" and int(p, 16) == port:
                found.add(addr)
    return found


def _s3(exports: dict):
    import boto3

    return boto3.client(
        "s3",
        endpoint_url=exports["AWS_ENDPOINT_URL"],
        aws_access_key_id=exports["AWS_ACCESS_KEY_ID"],
        aws_secret_access_key=exports["AWS_SECRET_ACCESS_KEY"],
        region_name=exports["AWS_DEFAULT_REGION"],
    )


# What marks an exception in the servers' logs: a traceback, a record at ERROR or above
# (Prefect writes `HH:MM:SS.mmm | ERROR   | logger - message`, uvicorn `ERROR:    ...`), or a
# request answered 5xx in MLflow's access log. Warnings and 4xx answers are not problems.
LOG_PROBLEM = re.compile(
    r"Traceback \(most recent call last\)|\b(ERROR|CRITICAL)\b|HTTP/[\d.]+\" 5\d\d "
)


# Prefect's own record of a worker heartbeat its SQLite database refused for a moment ("database
# is locked": two writers, one a heartbeat, as a worker stops or the server goes down); the
# next heartbeat writes it. Its record and traceback run to the next timestamped record.
SQLITE_HEARTBEAT = re.compile(
    r"\| ERROR +\| prefect\.server\.utilities\.worker_channel - Worker "
    r"channel heartbeat persistence failed"
)
RECORD = re.compile(r"^\d\d:\d\d:\d\d\.\d+ \||^=== ")
# Starlette's error when a websocket client of the server goes away before the server
# accepted it: a task of the server's handler, whose exception asyncio logs when the task is
# collected. The client left; nothing failed.
UNRETRIEVED = re.compile(r"\| ERROR +\| asyncio - Task exception was never retrieved")
CLIENT_LEFT = 'WebSocketDisconnected: WebSocket is not connected. Need to call "accept" first.'


def _log(home: Path, service: str) -> Path:
    return home / "stack" / "logs" / f"{service}.log"


def _known_records(lines: list[str]) -> set[int]:
    """The lines of each `SQLITE_HEARTBEAT` record whose exception is SQLite's lock, and of
    each `UNRETRIEVED` record whose exception is a websocket client that left (`CLIENT_LEFT`)."""
    known: set[int] = set()
    for mark, cause in ((SQLITE_HEARTBEAT, "database is locked"), (UNRETRIEVED, CLIENT_LEFT)):
        for i in [i for i, line in enumerate(lines) if mark.search(line)]:
            end = next((j for j in range(i + 1, len(lines)) if RECORD.search(lines[j])), len(lines))
            if any(cause in line for line in lines[i:end]):
                known.update(range(i, end))
    return known


def _tail(path: Path, chars: int = 6000) -> str:
    try:
        return path.read_text(errors="replace")[-chars:]
    except OSError as e:
        return f"({path}: {e})"


def _assert_clean_logs(home: Path, services=("prefect", "mlflow")) -> None:
    """The servers logged no exception while the module's tests used them."""
    found = []
    for service in services:
        path = _log(home, service)
        assert path.exists(), f"no log of the {service} server at {path}"
        lines = path.read_text(errors="replace").splitlines()
        hits = {i for i, line in enumerate(lines) if LOG_PROBLEM.search(line)}
        for i in [i for i in hits if lines[i].startswith("Traceback")]:
            # and the exception itself: the first unindented line after the traceback
            end = next((j for j in range(i + 1, len(lines)) if lines[j][:1] != " "), None)
            if end is not None:
                hits.add(end)
        hits -= _known_records(lines)
        if hits:
            shown = "\n".join(f"  {i + 1}: {lines[i]}" for i in sorted(hits)[:24])
            found.append(f"{path} ({len(hits)} lines):\n{shown}")
    assert not found, "the stack's servers logged errors:\n" + "\n".join(found)


@pytest.fixture(scope="module")
def stack(tmp_path_factory):
    """The stack for the module; on teardown, `down`, then the servers' logs hold no errors."""
    home = tmp_path_factory.mktemp("stack-home")
    env = {k: v for k, v in os.environ.items() if k not in CLIENT_VARS}
    ports = {"s3": free_port(), "prefect": free_port(), "mlflow": free_port()}
    env.update(
        HETFLOW_HOME=str(home),
        PREFECT_HOME=str(home / "prefect-client"),  # the CLI's profile, not the user's ~/.prefect
        PREFECT_SERVER_ANALYTICS_ENABLED="false",
        # `stack up` passes its environment on to the server: the scheduler's main loop every
        # 2 s instead of 60 s
        PREFECT_SERVER_SERVICES_SCHEDULER_LOOP_SECONDS="2",
        # the tests start their own workers (flags of their own) until the last test's `up`
        HETFLOW_STACK_WORKER="0",
        **{f"HETFLOW_STACK_{k.upper()}_PORT": str(v) for k, v in ports.items()},
    )
    up = _cli(env, "stack", "up")
    try:
        assert up.returncode == 0, f"stack up failed:\n{up.stdout}\n{up.stderr}"
        yield {"env": env, "home": home, "ports": ports, "up": up, "exports": _exports(up.stdout)}
    finally:
        down = _cli(env, "stack", "down", timeout=120)
    assert down.returncode == 0, down.stderr
    worker_pid = home / "stack" / "worker.pid"
    assert not worker_pid.exists(), down.stdout  # the worker stops with the stack
    _assert_clean_logs(home)


@pytest.fixture(scope="module")
def deployed(stack) -> dict[str, str]:
    """`prefect deploy --all` from the repo root against the stack; deployment name -> id."""
    from prefect.client.orchestration import SyncPrefectClient

    ex = stack["exports"]
    deploy = subprocess.run(
        [sys.executable, "-m", "prefect", "--no-prompt", "deploy", "--all"],
        cwd=REPO,
        env={**stack["env"], **ex},
        capture_output=True,
        text=True,
        timeout=240,
        check=False,
    )
    hint = ""
    if "422 Unprocessable Entity" in deploy.stdout + deploy.stderr:
        hint = (
            "\nThe server rejected a null that Prefect's client sends for an optional body "
            "field: fastapi >= 0.151 no longer reads null as 'use the default'; Prefect "
            "3.8.8 needs fastapi < 0.151 (pyproject.toml)."
        )
    assert deploy.returncode == 0, (
        f"prefect deploy --all failed:\n{deploy.stdout[-4000:]}\n{deploy.stderr[-4000:]}{hint}"
    )
    with SyncPrefectClient(ex["PREFECT_API_URL"]) as client:
        return {d.name: d.id for d in client.read_deployments()}


def test_up_serves_s3_mlflow_and_prefect_on_loopback(stack):
    ex, ports = stack["exports"], stack["ports"]
    assert set(ex) == {
        "HETFLOW_HOME",
        "PREFECT_API_URL",
        "MLFLOW_TRACKING_URI",
        "AWS_ENDPOINT_URL",
        "AWS_ACCESS_KEY_ID",
        "AWS_SECRET_ACCESS_KEY",
        "AWS_DEFAULT_REGION",
    }
    assert ex["HETFLOW_HOME"] == str(stack["home"])  # a worker in a new shell reads this home
    assert ex["PREFECT_API_URL"] == f"http://127.0.0.1:{ports['prefect']}/api"
    said = stack["up"].stdout
    assert (
        "# saved blocks: cluster-spec/demo-1-1-2-4, cluster-spec/queue-6, dataset-spec/digits"
        in said
    )
    assert "# deployments run once a worker polls the pool: prefect worker start --pool " in said
    assert ex["MLFLOW_TRACKING_URI"] == f"http://127.0.0.1:{ports['mlflow']}"
    assert ex["AWS_ENDPOINT_URL"] == f"http://127.0.0.1:{ports['s3']}"
    env_sh = (stack["home"] / "stack" / "env.sh").read_text()
    assert all(f"export {k}={v}" in env_sh for k, v in ex.items())

    assert _answers(ex["PREFECT_API_URL"] + "/health")
    assert _answers(ex["MLFLOW_TRACKING_URI"] + "/health")
    assert _answers(ex["AWS_ENDPOINT_URL"] + "/moto-api/config")
    for port in ports.values():  # bound to loopback only (127.0.0.1 is 0100007F in /proc)
        addrs = _listen_addresses(port)
        if addrs:
            assert addrs == {"0100007F"}, f"port {port} listens on {addrs}"

    s3 = _s3(ex)
    bucket, key, body = S3_PROBE
    s3.create_bucket(Bucket=bucket)
    s3.put_object(Bucket=bucket, Key=key, Body=body)
    assert s3.get_object(Bucket=bucket, Key=key)["Body"].read() == body

    status = _cli(stack["env"], "stack", "status", timeout=60)
    assert status.returncode == 0, status.stdout + status.stderr
    lines = {
        line.split()[0]: line.split()[1] for line in status.stdout.splitlines() if line.strip()
    }
    assert {lines["s3"], lines["prefect"], lines["mlflow"]} == {"up"}

    again = _cli(stack["env"], "stack", "up", timeout=60)
    assert again.returncode == 0 and "already running" in again.stdout


def test_mlflow_stores_artifacts_in_the_stack_s3(stack, tmp_path):
    from mlflow.tracking import MlflowClient

    ex = stack["exports"]
    client = MlflowClient(tracking_uri=ex["MLFLOW_TRACKING_URI"])
    exp = client.create_experiment(f"stack-test-{uuid.uuid4().hex[:8]}")
    run = client.create_run(exp)
    client.log_metric(run.info.run_id, "loss", 0.5)
    note = tmp_path / "note.txt"
    note.write_text("artifact through the MLflow server")
    client.log_artifact(run.info.run_id, str(note))
    client.set_terminated(run.info.run_id)

    assert [a.path for a in client.list_artifacts(run.info.run_id)] == ["note.txt"]
    objects = _s3(ex).list_objects_v2(Bucket="hetflow-mlflow", Prefix="artifacts/")
    keys = [o["Key"] for o in objects.get("Contents", [])]
    mine = [k for k in keys if run.info.run_id in k and k.endswith("note.txt")]
    assert mine, keys
    got = _s3(ex).get_object(Bucket="hetflow-mlflow", Key=mine[0])["Body"].read()
    assert got == note.read_bytes()


def test_deploy_all_and_run_prepare_dataset_on_a_process_worker(stack, deployed):
    from prefect.client.orchestration import SyncPrefectClient

    ex = stack["exports"]
    env = {**stack["env"], **ex}
    api = ex["PREFECT_API_URL"]
    pool = json.loads(urllib.request.urlopen(f"{api}/work_pools/hetflow-local", timeout=10).read())
    assert pool["type"] == "process"  # `stack up` created the pool that prefect.yaml names

    dataset_url = f"s3://hetflow-deploy-test/digits-{uuid.uuid4().hex[:6]}"
    with SyncPrefectClient(api) as client:
        deps = {
            name: client.read_deployment_by_name(f"{name}/{name}")
            for name in ("profile-cluster", "prepare-dataset", "train", "compare")
        }
        for name in ("train", "compare"):
            assert deps[name].global_concurrency_limit.limit == 1
        assert deps["prepare-dataset"].global_concurrency_limit is None
        assert [s.schedule.cron for s in deps["profile-cluster"].schedules] == ["0 2 * * *"]
        assert [s.schedule.cron for s in deps["compare"].schedules] == ["0 3 * * 1"]
        assert not deps["prepare-dataset"].schedules and not deps["train"].schedules
        schema = deps["compare"].parameter_openapi_schema  # forms: the pydantic config models
        assert {"cluster", "dataset", "train"} == set(schema["properties"])
        defs = schema["definitions"]
        assert defs["ClusterBlock"]["block_type_slug"] == "cluster-spec"  # picked by name
        assert defs["DatasetBlock"]["block_type_slug"] == "dataset-spec"
        slugs = {b.block_type.slug: b.name for b in client.read_block_documents()}
        assert {"cluster-spec", "dataset-spec"} <= set(slugs)  # prefect.yaml's build step
        assert deps["prepare-dataset"].pull_steps == [
            {"prefect.deployments.steps.set_working_directory": {"directory": str(REPO)}}
        ]

        run = client.create_flow_run_from_deployment(
            deps["prepare-dataset"].id,
            parameters={"dataset": {"url": dataset_url, "shard_samples": 512}, "overwrite": True},
        )
        worker = start_worker(stack, env, subprocess.PIPE, "--run-once", "--limit", "1")
        try:
            deadline = time.monotonic() + 180
            state = client.read_flow_run(run.id).state
            while not (state and state.is_final()) and time.monotonic() < deadline:
                time.sleep(0.5)
                state = client.read_flow_run(run.id).state
            worker_out = worker.communicate(timeout=60)[0] if state and state.is_final() else ""
        finally:
            if worker.poll() is None:
                worker.kill()
                worker_out = worker.communicate()[0]
        assert state is not None and state.is_completed(), (
            f"flow run ended {state and state.type}: {state and state.message}\n"
            f"{worker_out[-6000:]}"
        )

    bucket, prefix = dataset_url.removeprefix("s3://").split("/", 1)
    manifest = json.loads(
        _s3(ex).get_object(Bucket=bucket, Key=f"{prefix}/manifest.json")["Body"].read()
    )
    assert sum(s["samples"] for s in manifest["splits"].values()) == 1797  # scikit-learn's digits


def _scheduled_in_prefect_yaml() -> set[str]:
    """Deployments of prefect.yaml with at least one active schedule."""
    spec = yaml.safe_load((REPO / "prefect.yaml").read_text())
    return {
        d["name"]
        for d in spec["deployments"]
        if any(s.get("active", True) for s in d.get("schedules") or [])
    }


def test_the_scheduler_creates_runs_of_every_scheduled_deployment(stack, deployed):
    """The server's scheduler turns each schedule of prefect.yaml into SCHEDULED flow runs.

    A schedule that shows as active but never yields a run (the server's scheduler failing on
    every loop, as with SQLAlchemy 2.1) fails here; the deployments without a schedule get none.
    """
    from prefect.client.orchestration import SyncPrefectClient
    from prefect.client.schemas.filters import (
        FlowRunFilter,
        FlowRunFilterState,
        FlowRunFilterStateType,
    )
    from prefect.client.schemas.objects import StateType

    wanted = _scheduled_in_prefect_yaml()
    assert wanted and wanted <= set(deployed), (wanted, deployed)
    names = {v: k for k, v in deployed.items()}
    only_scheduled = FlowRunFilter(
        state=FlowRunFilterState(type=FlowRunFilterStateType(any_=[StateType.SCHEDULED]))
    )
    got: dict[str, list] = {}
    deadline = time.monotonic() + 120
    with SyncPrefectClient(stack["exports"]["PREFECT_API_URL"]) as client:
        while set(got) != wanted and time.monotonic() < deadline:
            time.sleep(1.0)
            got = {}
            for run in client.read_flow_runs(flow_run_filter=only_scheduled):
                if run.auto_scheduled and run.deployment_id in names:
                    got.setdefault(names[run.deployment_id], []).append(run)
    log = _log(stack["home"], "prefect")
    assert set(got) == wanted, (
        f"the scheduler made runs of {sorted(got)} within 120 s; expected {sorted(wanted)}; "
        f"tail of {log}:\n{_tail(log)}"
    )
    for name, runs in got.items():  # the next occurrences of the cron, none in the past
        starts = [r.expected_start_time for r in runs]
        assert min(starts) > runs[0].created, (name, starts)


SMALL = {
    "recipe": "digits-mlp",
    "steps": 20,
    "eval_every": 10,
    "global_batch": 64,
    "checkpoint_every": 10,
}
SMALL_OPTIMIZED = {**SMALL, "schedule": "dynamic", "compression": "auto"}  # the optimized preset


def _wait_final(client, run_ids, deadline_s: float) -> dict:
    deadline = time.monotonic() + deadline_s
    while time.monotonic() < deadline:
        runs = {rid: client.read_flow_run(rid) for rid in run_ids}
        if all(r.state and r.state.is_final() for r in runs.values()):
            return runs
        time.sleep(1.0)
    return {rid: client.read_flow_run(rid) for rid in run_ids}


@pytest.mark.timeout(600)
def test_runs_triggered_through_the_prefect_api_land_in_the_mlflow_server(
    stack, deployed, tmp_path, fault_table
):
    """A compare run and two train runs submitted at once, as from the UI, to a process worker.

    compare: both variants are children of one parent run in the MLflow server, with the
    run metrics (fractions in [0, 1]), the plots, and the Prefect markdown artifact's
    numbers equal to the runs' metrics. train: the deployment's concurrency limit of 1 makes
    the two runs take turns instead of sharing the cores, and both finish. compare and a train
    run at the same time, on one dataset and one shard cache: each run keeps its own run
    directory, checkpoints and MLflow run (`_assert_runs_kept_apart`).
    """
    from mlflow import MlflowClient
    from prefect.client.orchestration import SyncPrefectClient
    from prefect.client.schemas.filters import ArtifactFilter, ArtifactFilterFlowRunId

    from hetflow.infra.report.table import NOT_REACHED, TO_TARGET, fmt

    ex = stack["exports"]
    env = {**stack["env"], **ex, "PREFECT_WORKER_QUERY_SECONDS": "2"}
    dataset = {"url": f"s3://hetflow-deploy-test/digits-{uuid.uuid4().hex[:6]}"}
    with SyncPrefectClient(ex["PREFECT_API_URL"]) as client:
        deps = {n: client.read_deployment_by_name(f"{n}/{n}") for n in ("compare", "train")}
        compare = client.create_flow_run_from_deployment(
            deps["compare"].id, parameters={"dataset": dataset, "train": SMALL}
        )
        trains = [
            client.create_flow_run_from_deployment(
                deps["train"].id,
                parameters={"dataset": dataset, "train": SMALL_OPTIMIZED, "variant": "optimized"},
            )
            for _ in range(2)
        ]
        # and a run whose MLflow is dead: it fails in its first task, in one line
        dead = f"http://127.0.0.1:{free_port()}"
        dead_run = client.create_flow_run_from_deployment(
            client.read_deployment_by_name("profile-cluster/profile-cluster").id,
            parameters={"tracking": {"tracking_uri": dead}},
        )
        log = (tmp_path / "worker.log").open("w")
        worker = start_worker(stack, env, log, "--limit", "4")
        try:
            runs = _wait_final(client, [compare.id, *[t.id for t in trains], dead_run.id], 480)
        finally:
            stop_worker(worker)
            log.close()
        tail = (tmp_path / "worker.log").read_text()[-6000:]
        _assert_failed_at_first_task(client, runs.pop(dead_run.id), dead, fault_table)
        for r in runs.values():
            assert r.state.is_completed(), (
                f"{r.name} ended {r.state.type}: {r.state.message}\n{tail}"
            )
        spans = sorted((runs[t.id].start_time, runs[t.id].end_time) for t in trains)
        assert spans[0][1] <= spans[1][0], f"train runs overlapped despite the limit: {spans}"
        artifacts = client.read_artifacts(
            artifact_filter=ArtifactFilter(flow_run_id=ArtifactFilterFlowRunId(any_=[compare.id]))
        )
        md = next(a for a in artifacts if a.key == "comparison").data

    mlflow = MlflowClient(ex["MLFLOW_TRACKING_URI"])
    exp = mlflow.get_experiment_by_name("hetflow")
    found = mlflow.search_runs([exp.experiment_id], f"tags.prefect_flow_run_id = '{compare.id}'")
    by = {r.data.tags["variant"]: r for r in found}
    assert set(by) == {"compare", "baseline", "optimized"}
    parent = by["compare"].info.run_id
    server = ex["MLFLOW_TRACKING_URI"].rstrip("/")
    for run in by.values():  # the Prefect artifact links each run on the MLflow server
        assert f"{server}/#/experiments/{exp.experiment_id}/runs/{run.info.run_id}?" in md
    cells = {
        line.split("|")[1].strip(): [c.strip() for c in line.split("|")[2:4]]
        for line in md.splitlines()
        if line.startswith("| ") and not line.startswith("| metric")
    }
    for variant, col in (("baseline", 0), ("optimized", 1)):
        run = by[variant]
        m = run.data.metrics
        assert run.data.tags["mlflow.parentRunId"] == parent
        assert run.data.tags["prefect_flow_run_url"].endswith(str(compare.id))
        for name in RUN_METRICS + [f"rank{r}/busy_fraction" for r in range(4)]:
            assert name in m, f"{variant} lacks {name}"
        for name in FRACTIONS + [f"rank{r}/busy_fraction" for r in range(4)]:
            assert 0.0 <= m[name] <= 1.0, (variant, name, m[name])
        alone = len(json.loads(run.data.params.get("plan.dropped", "[]"))) == 3  # one rank ran
        assert m["throughput_samples_per_s"] > 0 and m["s3_bytes_read"] >= 0
        assert (m["comm_bytes_total"] == 0) if alone else (m["comm_bytes_total"] > 0)
        for label, values in cells.items():  # the Prefect artifact says what MLflow holds
            name = label.split(" (", 1)[0]  # "time_to_target_s (accuracy ≥ 95.0%)", ...
            said = fmt(m.get(name), name)
            if name in TO_TARGET and m.get("time_to_target_s") is None:
                said = NOT_REACHED  # a target this variant did not meet: said, not a blank
            if label.endswith("(start plan)"):  # the plan it started on: a param, not a metric
                start = json.loads(run.data.params["plan.local_batches"])
                said = fmt(start[int(name.split("/")[0].removeprefix("rank"))], name)
            assert values[col] == said, (variant, label, values[col], m.get(name))
        plots = {a.path: a.file_size for a in mlflow.list_artifacts(run.info.run_id, "plots")}
        assert (
            set(plots) == {"plots/timeline.png", "plots/steps.png"} and min(plots.values()) > 1000
        )
    assert "throughput_samples_per_s" in cells and "rank3/busy_fraction" in cells
    parent_files = {a.path for a in mlflow.list_artifacts(parent)}
    assert {"comparison.json", "comparison.md", "plots"} <= parent_files
    trained = mlflow.search_runs([exp.experiment_id], "tags.variant = 'optimized'")
    mine = [
        r for r in trained if r.data.tags.get("prefect_flow_run_id") in {str(t.id) for t in trains}
    ]
    assert len(mine) == 2 and all(r.info.status == "FINISHED" for r in mine)
    _assert_runs_kept_apart(stack["home"], mlflow, {compare.id: by, **{t.id: None for t in trains}})
    fault_table.append(
        ("compare + 2 train runs submitted at once", "Prefect API", "all 3 finished", 0, "none", 3)
    )


def _assert_failed_at_first_task(client, run, dead: str, fault_table) -> None:
    """A deployment run given an MLflow URI nobody serves failed in `check services`, its
    first task, with one line naming the endpoint and the field to set."""
    from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterId

    assert run.state.is_failed(), f"{run.name} ended {run.state.type}: {run.state.message}"
    assert f"MLflow {dead} (tracking.tracking_uri) cannot be reached" in run.state.message
    assert "\n" not in run.state.message
    tasks = client.read_task_runs(flow_run_filter=FlowRunFilter(id=FlowRunFilterId(any_=[run.id])))
    assert [t.name for t in tasks] == ["check services"]
    took = (run.end_time - run.start_time).total_seconds()
    fault_table.append(
        (
            "dead MLflow (tracking_uri)",
            "deployment run",
            f"failed at task 1, {took:.0f}s",
            0,
            "none",
            1,
        )
    )


def _assert_runs_kept_apart(home: Path, mlflow, flow_runs: dict) -> None:
    """Runs that ran at once each kept their own run directory (job, result, checkpoints) and
    MLflow run: every (flow run, variant) has a directory of its own, whose MLflow run is
    tagged with that flow run and FINISHED, and no two share an MLflow run."""
    mlflow_runs = []
    for flow_run, by in flow_runs.items():
        for variant in ("baseline", "optimized") if by else ("optimized",):
            run_dir = home / "runs" / f"{flow_run}-{variant}"
            for name in ("job.json", "result.json", "checkpoints/latest.json"):
                assert (run_dir / name).is_file(), f"{run_dir} lacks {name}"
            job = json.loads((run_dir / "job.json").read_text())
            assert job["run_dir"] == str(run_dir)
            run = mlflow.get_run((run_dir / "mlflow_run_id").read_text().strip())
            assert run.data.tags["prefect_flow_run_id"] == str(flow_run), run_dir
            assert run.info.status == "FINISHED" and run.data.tags["variant"] == variant
            if by:
                assert by[variant].info.run_id == run.info.run_id
            mlflow_runs.append(run.info.run_id)
    assert len(set(mlflow_runs)) == len(mlflow_runs) == 4, mlflow_runs


def test_down_stops_everything_and_s3_state_survives_a_restart(stack):
    env, ports, ex = stack["env"], stack["ports"], stack["exports"]
    down = _cli(env, "stack", "down", timeout=120)
    assert down.returncode == 0, down.stdout + down.stderr
    for name, port in ports.items():
        assert not _port_open(port), f"{name} still listens on {port}"
        assert not (stack["home"] / "stack" / f"{name}.pid").exists()
    status = _cli(env, "stack", "status", timeout=60)
    assert status.returncode == 1
    lines = {
        line.split()[0]: line.split()[1] for line in status.stdout.splitlines() if line.strip()
    }
    assert {lines["s3"], lines["prefect"], lines["mlflow"]} == {"down"}

    up = _cli(env, "stack", "up")
    assert up.returncode == 0, up.stdout + up.stderr
    bucket, key, body = S3_PROBE
    assert _s3(ex).get_object(Bucket=bucket, Key=key)["Body"].read() == body
    # the MLflow artifacts written earlier are still in the bucket MLflow uses
    assert (
        _s3(ex).list_objects_v2(Bucket="hetflow-mlflow", Prefix="artifacts/").get("KeyCount", 0)
        >= 1
    )


def test_up_starts_a_worker_and_every_deployment_is_ready(stack, deployed):
    """Last in the module: `up` on the running stack starts the pool's worker, the server
    reports every deployment READY, and the stack's `down` (the fixture's) stops it."""
    from prefect.client.orchestration import SyncPrefectClient

    up = _cli({**stack["env"], "HETFLOW_STACK_WORKER": "1"}, "stack", "up", timeout=240)
    assert up.returncode == 0, up.stdout + up.stderr
    assert re.search(r"# worker: pid \d+ polls hetflow-local: deployments are Ready", up.stdout)
    status = _cli(stack["env"], "stack", "status", timeout=60)
    assert re.search(r"^worker +up +pid \d+ +pool hetflow-local ready$", status.stdout, re.M)
    with SyncPrefectClient(stack["exports"]["PREFECT_API_URL"]) as client:
        deadline = time.monotonic() + 90
        while True:
            states = {d.name: d.status.value for d in client.read_deployments()}
            if set(states.values()) == {"READY"} or time.monotonic() > deadline:
                break
            time.sleep(1)
    assert set(states) == set(deployed) and set(states.values()) == {"READY"}, states


def start_worker(stack, env: dict, log, *flags: str) -> subprocess.Popen:
    """A Prefect process worker of the pool `hetflow-local`, in the stack's home with `env`,
    its output to `log`; `flags` added to `prefect worker start`."""
    return subprocess.Popen(
        [sys.executable, "-m", "prefect", "worker", "start", "--pool", "hetflow-local", *flags],
        cwd=stack["home"],
        env=env,
        stdout=log,
        stderr=subprocess.STDOUT,
        text=True,
    )


def stop_worker(worker: subprocess.Popen) -> None:
    """Terminate a worker `start_worker` started; kill it after 30 s."""
    worker.terminate()
    try:
        worker.wait(timeout=30)
    except subprocess.TimeoutExpired:
        worker.kill()
        worker.wait()


def test_the_log_check_passes_over_sqlites_lock_on_a_heartbeat_only():
    heartbeat = (
        "16:22:22.847 | ERROR   | prefect.server.utilities.worker_channel - Worker channel "
        "heartbeat persistence failed: work_pool=hetflow-local worker_name=w"
    )
    trace = ["Traceback (most recent call last):", '  File "x.py", line 1, in f']
    lines = [
        heartbeat,
        *trace,
        "sqlite3.OperationalError: database is locked",
        "16:22:23.000 | INFO    | prefect.server - fine",
        heartbeat,  # the same record for another cause is a problem
        *trace,
        "ValueError: boom",
        "16:22:24.000 | ERROR   | prefect.server - another",
    ]
    assert _known_records(lines) == {0, 1, 2, 3}


def test_the_log_check_passes_over_a_websocket_client_that_left_before_its_accept():
    unretrieved = "11:49:23.606 | ERROR   | asyncio - Task exception was never retrieved"
    trace = ["Traceback (most recent call last):", '  File "x.py", line 1, in f']
    lines = [
        unretrieved,
        "future: <Task finished name='Task-9' coro=<f()> exception=WebSocketDisconnected()>",
        *trace,
        "starlette.websockets." + CLIENT_LEFT,
        "11:49:24.000 | INFO    | prefect.server - fine",
        unretrieved,  # another task's exception is a problem
        *trace,
        "ValueError: boom",
    ]
    assert _known_records(lines) == {0, 1, 2, 3, 4}
