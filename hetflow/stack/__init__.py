"""A persistent local stack on 127.0.0.1: an S3 endpoint, a Prefect server, an MLflow server.

    hetflow stack up       start what is not running, create the `hetflow-local` work pool,
                           save the demo's cluster and dataset blocks, start a process worker
                           on the pool (the deployments are then Ready), and print the
                           `export ...` lines (`eval "$(hetflow stack up)"` works)
    hetflow stack status   one line per service and the worker: up or down, pid, URL, log file
    hetflow stack down     stop the worker and the services (SIGTERM to each process group,
                           then SIGKILL)

State lives in `$HETFLOW_HOME/stack` (`~/.hetflow/stack`); the S3 endpoint (moto) keeps its
objects across restarts by replaying its recorded requests. Ports: `HETFLOW_STACK_S3_PORT`,
`HETFLOW_STACK_PREFECT_PORT`, `HETFLOW_STACK_MLFLOW_PORT`, else the last `up`'s, else 5555,
4200, 5000. What the directory holds and what a restart keeps: docs/deploy.md.
"""

from __future__ import annotations

import os
import sys

from hetflow.stack.layout import (
    HOST,
    MLFLOW,
    MLFLOW_BUCKET,
    PREFECT,
    S3,
    SERVICES,
    WORK_POOL,
    Service,
    StackError,
    chosen_port,
    log_path,
    pid_file,
    recording_path,
    saved_ports,
    stack_dir,
    url_of,
)
from hetflow.stack.processes import healthy, port_open, running_pid, stop, wait_healthy
from hetflow.stack.services import (
    _print_exports,
    _save_ports,
    compact_s3,
    ensure_bucket,
    ensure_work_pool,
    start_mlflow,
    start_prefect,
    start_s3,
)
from hetflow.stack.worker import (
    WORKER,
    WORKER_COMMAND,
    pool_status,
    save_blocks,
    start_worker,
    stop_worker,
    wanted,
)


def _progress(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def up() -> int:
    """Start every service that is not running; 0 when all answer, 1 otherwise."""
    try:
        return _up()
    except StackError as e:
        print(f"hetflow stack: error: {e}", file=sys.stderr)
        return 1


def _up() -> int:
    saved = saved_ports()
    running = {svc: pid for svc in SERVICES if (pid := running_pid(svc)) is not None}
    ports = {
        svc.name: (
            saved.get(svc.name) if svc in running and svc.name in saved else chosen_port(svc, saved)
        )
        for svc in SERVICES
    }
    if len(running) == len(SERVICES):
        print(
            "# hetflow stack: already running "
            f"({', '.join(f'{s.name} pid {p}' for s, p in running.items())})"
        )
        _print_exports(ports)
        _worker_up(ports, _timeout())
        return 0
    to_start = [svc for svc in SERVICES if svc not in running]
    for svc in to_start:
        if port_open(ports[svc.name]):
            raise StackError(
                f"cannot start {svc.name}: {HOST}:{ports[svc.name]} is already in use "
                f"(set {svc.port_env} to a free port)"
            )
    timeout = _timeout()
    _save_ports(ports)  # from here on, `status` and `down` find the services
    started: list[tuple[Service, int]] = []
    try:
        if S3 in to_start:
            _progress(f"starting s3 on {url_of(S3, ports['s3'])} ...")
            started.append((S3, start_s3(ports["s3"], timeout).pid))
        ensure_bucket(ports["s3"], MLFLOW_BUCKET)
        procs = {}
        if PREFECT in to_start:
            _progress(f"starting prefect on {url_of(PREFECT, ports['prefect'])} ...")
            procs[PREFECT] = (start_prefect(ports["prefect"]), ports["prefect"])
        if MLFLOW in to_start:
            _progress(f"starting mlflow on {url_of(MLFLOW, ports['mlflow'])} ...")
            procs[MLFLOW] = (start_mlflow(ports["mlflow"], ports["s3"]), ports["mlflow"])
        started += [(svc, proc.pid) for svc, (proc, _) in procs.items()]
        wait_healthy(procs, timeout)
        ensure_work_pool(ports["prefect"])
        saved = save_blocks(ports["prefect"])
    except BaseException:
        for svc, pid in reversed(started):  # leave nothing half-started behind
            stop(svc, pid, ports[svc.name], grace=5.0)
        raise
    print(f"# hetflow stack: up, state in {stack_dir()}")
    if saved:
        print(f"# saved blocks: {', '.join(saved)}")
    _print_exports(ports)
    _worker_up(ports, timeout)
    return 0


def _timeout() -> float:
    try:
        return float(os.environ.get("HETFLOW_STACK_TIMEOUT") or 180)
    except ValueError:
        raise StackError(
            f"HETFLOW_STACK_TIMEOUT: expected seconds (got {os.environ['HETFLOW_STACK_TIMEOUT']!r})"
        ) from None


def _worker_up(ports: dict[str, int], timeout: float) -> None:
    """Start the pool's worker (unless HETFLOW_STACK_WORKER=0) and say so in one line."""
    if not wanted():
        print(f"# deployments run once a worker polls the pool: {WORKER_COMMAND}")
        return
    _progress(f"starting a worker on pool {WORK_POOL} ...")
    pid = start_worker(ports, timeout)
    print(f"# worker: pid {pid} polls {WORK_POOL}: deployments are Ready (log: {log_path(WORKER)})")


def status() -> int:
    """One line per service (up, down, or no-answer: running but not answering yet);
    0 when all three are up, 1 otherwise."""
    saved = saved_ports()
    all_up = True
    for svc in SERVICES:
        port = saved.get(svc.name) or chosen_port(svc, saved)
        pid = running_pid(svc)
        state = "up" if pid is not None and healthy(svc, port) else ("no-answer" if pid else "down")
        all_up &= state == "up"
        shown = f"pid {pid}" if pid else "-"
        print(f"{svc.name:<8} {state:<8} {shown:<11} {url_of(svc, port):<24} log: {log_path(svc)}")
    pid = running_pid(WORKER)
    pool = pool_status(saved["prefect"]) if "prefect" in saved else "unknown"
    shown = f"pid {pid}" if pid else "-"
    print(f"{'worker':<8} {'up' if pid else 'down':<8} {shown:<11} pool {WORK_POOL} {pool.lower()}")
    if all_up:
        print(f"env: . {stack_dir() / 'env.sh'}")
    return 0 if all_up else 1


def down() -> int:
    """Stop the worker, then the services (MLflow and Prefect first, then S3 after compacting
    its state)."""
    saved = saved_ports()
    pid = stop_worker()
    print(f"worker: stopped (pid {pid})" if pid else "worker: not running")
    for svc in reversed(SERVICES):
        pid = running_pid(svc)
        port = saved.get(svc.name)
        if pid is None:
            pid_file(svc).unlink(missing_ok=True)
            print(f"{svc.name}: not running")
            continue
        if svc is S3 and port is not None:
            try:
                kept = compact_s3(port)
                print(f"s3: state saved ({kept} objects) in {recording_path()}")
            except Exception as e:
                print(
                    f"s3: could not compact its state ({type(e).__name__}: {e}); "
                    f"keeping the request log {recording_path()}",
                    file=sys.stderr,
                )
        stop(svc, pid, port)
        print(f"{svc.name}: stopped (pid {pid})")
    return 0
