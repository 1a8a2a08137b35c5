"""The stack's Prefect worker: a process worker polling the `hetflow-local` pool, so that the
deployments of prefect.yaml are Ready once `hetflow stack up` returns, and the stack's saved
blocks (the demo's clusters, the digits dataset).

The worker runs with the stack's exports and `HETFLOW_HOME` (a flow run is a subprocess of
it), logs to `$HETFLOW_HOME/stack/logs/worker.log`, and stops with `hetflow stack down`.
`HETFLOW_STACK_WORKER=0` leaves it out; `up` then prints the one command that starts one.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import urllib.error

from hetflow.stack.layout import PREFECT, WORK_POOL, Service, StackError, exports, url_of
from hetflow.stack.processes import http_get, running_pid, spawn, stop

# Not a server: no port, no health path; `marker` tells it from a recycled pid.
WORKER = Service("worker", 0, "", "worker start")
WORKER_COMMAND = f"prefect worker start --pool {WORK_POOL}"


def wanted() -> bool:
    """Whether `up` starts the worker (`HETFLOW_STACK_WORKER`, default on)."""
    return os.environ.get("HETFLOW_STACK_WORKER", "1").strip().lower() not in ("0", "false", "no")


def worker_env(ports: dict[str, int]) -> dict[str, str]:
    from hetflow.stack.services import base_env

    return {**base_env(), **exports(ports)}


def pool_status(prefect_port: int) -> str:
    """The work pool's status as the server reports it: READY once a worker polls it."""
    try:
        raw = http_get(f"{url_of(PREFECT, prefect_port)}/api/work_pools/{WORK_POOL}")
    except (OSError, urllib.error.URLError):
        return "unknown"
    return str(json.loads(raw).get("status") or "unknown")


def start_worker(ports: dict[str, int], timeout: float) -> int:
    """Start the worker unless one of ours runs; wait until the server reports the pool
    READY. Returns its pid; a StackError naming its log if it exits or the pool stays
    not ready past `timeout` seconds."""
    pid = running_pid(WORKER)
    if pid is not None:
        return pid
    cmd = [sys.executable, "-m", "prefect", "worker", "start", "--pool", WORK_POOL]
    cmd += ["--type", "process"]
    proc = spawn(WORKER, cmd, worker_env(ports))
    deadline = time.monotonic() + timeout
    while pool_status(ports["prefect"]) != "READY":
        if proc.poll() is not None:
            raise StackError(f"worker exited with code {proc.returncode}; see its log")
        if time.monotonic() > deadline:
            stop(WORKER, proc.pid, None, grace=5.0)
            raise StackError(f"worker: pool {WORK_POOL!r} not ready within {timeout:.0f}s")
        time.sleep(0.5)
    return proc.pid


def stop_worker() -> int | None:
    """Stop the worker (its flow runs with it); the pid it had, or None."""
    pid = running_pid(WORKER)
    if pid is not None:
        stop(WORKER, pid, None)
    return pid


def save_blocks(prefect_port: int) -> list[str]:
    """Register the ClusterSpec and DatasetSpec block types and save the demo's blocks not
    saved yet (`hetflow.flows.blocks`), in a subprocess against the stack's Prefect."""
    env = {**os.environ, "PREFECT_API_URL": f"{url_of(PREFECT, prefect_port)}/api"}
    done = subprocess.run(
        [sys.executable, "-m", "hetflow.flows.blocks"],
        check=False,
        env=env,
        capture_output=True,
        text=True,
        timeout=180,
    )
    if done.returncode != 0:
        last = (done.stderr or done.stdout).strip().splitlines()[-1:] or ["no output"]
        raise StackError(f"prefect: could not save the demo's blocks: {last[0]}")
    return json.loads(done.stdout.strip().splitlines()[-1])
