"""The torchrun launcher: one process per worker on this machine, watched until it exits.

`run.run_workers` checks the job and hands it here when the cluster's `launcher` is `local`.
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import time
from pathlib import Path

from hetflow.infra.s3 import free_port
from hetflow.training.cpu_quota import JobCgroups, find_controller
from hetflow.training.faults.watch import JobWatch, dump_stacks, job_pids, kill_job
from hetflow.training.launch.agents import current as current_agents
from hetflow.training.launch.mps import mps_daemon
from hetflow.training.launch.outcome import Launched, LaunchError, RankFailed
from hetflow.training.launch.spec import RunSpec


def torchrun_command(
    job: Path,
    nproc: int,
    endpoint: str,
    nnodes: int = 1,
    rdzv_id: str = "hetflow",
    max_restarts: int = 0,
    warm: bool = False,
) -> list[str]:
    """torchrun: c10d rendezvous across nodes (run the same command on each of them).

    On one node the static rendezvous is used: after an elastic restart, c10d's restarted
    round on one host sometimes fails to build the gloo mesh (connection refused to a peer of
    the previous round), while the static one comes back at the first restart.
    `warm`: the same flags to torchrun's agent made warm (`launch.warm`), which forks each
    rank from itself with the rank's imports done; else each rank is a fresh interpreter.
    """
    if nnodes == 1:
        host, port = endpoint.rsplit(":", 1)
        rdzv = ["--rdzv-backend", "static", "--master-addr", host, "--master-port", port]
    else:
        rdzv = ["--rdzv-backend", "c10d", "--rdzv-endpoint", endpoint, "--rdzv-id", rdzv_id]
    agent = ["hetflow.training.launch.warm"] if warm else ["torch.distributed.run"]
    entry = ["hetflow.training.worker"] if warm else ["-m", "hetflow.training.worker"]
    return [
        sys.executable,
        "-m",
        *agent,
        "--nnodes",
        str(nnodes),
        "--nproc-per-node",
        str(nproc),
        *rdzv,
        "--max-restarts",
        str(max_restarts),
        *entry,
        "--job",
        str(job),
    ]


def worker_env(spec: RunSpec) -> dict[str, str]:
    return {**os.environ, "OMP_NUM_THREADS": str(spec.train.threads_per_rank)}


def run_torchrun(
    spec: RunSpec, timeout_s: float = 1800, on_progress=None, warm: bool = False
) -> Launched:
    """Write the job file, run torchrun to completion, return its result and wall seconds.
    `warm`: the ranks forked from an agent that imported what they run (`launch.warm`), for
    jobs whose every rank is on the CPU (`run.run_workers` decides): one kept waiting by an
    open `agents.agent_pool` where one waits, its imports done before the submit.

    `spec` comes checked and placed by `run.run_workers` (backend, precisions, submitted_at).
    Workers with a `cpu_quota` run in cgroups of their own, made before the ranks start and
    removed after the job, however it ended (`cpu_quota.JobCgroups`).
    torchrun restarts the workers when one dies or stalls, as many times as the failure
    policy says (`train.faults.group_restarts`); they resume from the last checkpoint. A
    rank that raises ends the job at once (`RankFailed`); any other non-zero exit, or the job
    still running after `timeout_s`, is a `LaunchError`.
    `on_progress(step)` is called about once a second with the last completed step (from
    rank 0's progress.json).
    """
    run_dir = Path(spec.run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    job = spec.write(run_dir / "job.json")
    cmd = torchrun_command(
        job,
        spec.cluster.world_size,
        f"127.0.0.1:{free_port()}",
        rdzv_id=spec.run_name,
        max_restarts=spec.train.faults.group_restarts,
        warm=warm,
    )
    watch = JobWatch(run_dir, spec.train.stall_timeout_s)
    log = run_dir / "workers.log"
    t = time.perf_counter()
    cgroups = JobCgroups.of(spec.cluster, spec.run_name, find_controller())
    with (
        log.open("wb") as out,
        mps_daemon(spec.cluster, worker_env(spec)) as env,
        cgroups or contextlib.nullcontext(),
    ):
        proc = _agent(cmd, env, log) if warm else None
        if proc is None:
            proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, env=env)
        try:
            _watch(proc, watch, run_dir, t + timeout_s, on_progress, warm)
        except BaseException:
            kill_job(proc.pid)
            proc.wait()
            raise
    wall = time.perf_counter() - t
    if proc.returncode != 0:
        failure = watch.fatal()
        if failure is not None:
            raise RankFailed(failure, log)
        tail = log.read_text(errors="replace").strip().splitlines()[-15:]
        raise LaunchError(
            f"torchrun exited {proc.returncode} (log: {log}):\n" + "\n".join(watch.stalls + tail)
        )
    return Launched(json.loads((run_dir / "result.json").read_text()), wall)


def _agent(cmd: list[str], env: dict[str, str], log: Path) -> subprocess.Popen | None:
    """A warm agent of the open `agents.agent_pool`, given torchrun's flags of `cmd` (those
    after `python -m hetflow.training.launch.warm`), `env` and the job's `log`; None where
    no pool is open or none waits (the caller starts one)."""
    pool = current_agents()
    return pool.take({"argv": cmd[3:], "log": str(log)}, env) if pool is not None else None


def _watch(
    proc: subprocess.Popen,
    watch: JobWatch,
    run_dir: Path,
    deadline: float,
    on_progress,
    warm: bool = False,
):
    """Until torchrun exits: raise on a rank's failure or past the deadline (every rank's
    stacks in the log and the error first: `faults.watch.dump_stacks`), kill stalled ranks,
    report progress. `warm`: torchrun is the warm agent, which writes its stacks too."""
    progress = run_dir / "progress.json"
    last_report = 0.0
    while proc.poll() is None:
        now = time.perf_counter()
        if now > deadline:
            dump_stacks(proc.pid, agent=warm)  # into the log: where each rank was
            log = run_dir / "workers.log"
            tail = log.read_text(errors="replace").strip().splitlines()[-60:]
            raise LaunchError(f"torchrun ran past its deadline (log: {log}):\n" + "\n".join(tail))
        failure = watch.fatal()
        if failure is not None:
            raise RankFailed(failure, run_dir / "workers.log")
        for line in watch.stalled(job_pids(proc.pid)):
            print(line, flush=True)
        if on_progress is not None and progress.exists() and now - last_report >= 1.0:
            last_report = now
            try:
                on_progress(json.loads(progress.read_text())["step"])
            except (ValueError, KeyError):
                pass
        try:
            proc.wait(timeout=0.2)
        except subprocess.TimeoutExpired:
            pass
