"""Start the workers with torchrun (one process per emulated worker on this machine)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

from hetflow.config import ClusterSpec, DatasetSpec, TrainConfig
from hetflow.infra.s3 import free_port
from hetflow.records import Profile
from hetflow.training.cores import core_sets, host_cores
from hetflow.training.devices import check_devices
from hetflow.training.faults.records import RankFailure
from hetflow.training.faults.watch import JobWatch, job_pids, kill_job
from hetflow.training.launch.mps import check_mps, mps_available, mps_daemon
from hetflow.training.launch.spec import RunSpec


class LaunchError(RuntimeError):
    """torchrun exited non-zero; the message carries the tail of the workers' output."""


class RankFailed(LaunchError):
    """A rank raised (or met a NaN/Inf gradient): the job was ended at once, not restarted.
    `failure` is that rank's record; the message names the rank, step and exception."""

    def __init__(self, failure: RankFailure, log: Path) -> None:
        super().__init__(f"{failure.summary()}\n(the job was stopped; log: {log})")
        self.failure = failure


def torchrun_command(
    job: Path,
    nproc: int,
    endpoint: str,
    nnodes: int = 1,
    rdzv_id: str = "hetflow",
    max_restarts: int = 0,
) -> list[str]:
    """torchrun: c10d rendezvous across nodes (run the same command on each of them).

    On one node the static rendezvous is used: after an elastic restart, c10d's restarted
    round on one host sometimes fails to build the gloo mesh (connection refused to a peer of
    the previous round), while the static one comes back at the first restart.
    """
    if nnodes == 1:
        host, port = endpoint.rsplit(":", 1)
        rdzv = ["--rdzv-backend", "static", "--master-addr", host, "--master-port", port]
    else:
        rdzv = ["--rdzv-backend", "c10d", "--rdzv-endpoint", endpoint, "--rdzv-id", rdzv_id]
    return [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--nnodes",
        str(nnodes),
        "--nproc-per-node",
        str(nproc),
        *rdzv,
        "--max-restarts",
        str(max_restarts),
        "-m",
        "hetflow.training.worker",
        "--job",
        str(job),
    ]


def worker_env(spec: RunSpec) -> dict[str, str]:
    return {**os.environ, "OMP_NUM_THREADS": str(spec.train.threads_per_rank)}


def run_workers(
    spec: RunSpec, timeout_s: float = 1800, max_restarts: int = 3, on_progress=None
) -> tuple[dict, float]:
    """Write the job file, run torchrun to completion, return (result.json, wall seconds).

    Each worker's device and precision are checked on this host first (`check_devices`),
    which also sets the backend: NCCL when every rank has a CUDA device of its own, else gloo.
    Under `cluster.launcher == "ray"` the job runs on Ray Train instead
    (`ray_train.run_workers_ray`), its state in the dataset's bucket.

    torchrun restarts the workers up to `max_restarts` times when one dies or stalls; they
    resume from the last checkpoint. A rank that raises ends the job at once (`RankFailed`).
    `on_progress(step)` is called about once a second with the last completed step (from
    rank 0's progress.json).
    """
    placement = check_devices(spec.cluster, spec.train)  # a one-line error before launch
    core_sets(spec.cluster, host_cores())  # the cores asked for exist here
    check_mps(spec.cluster, *mps_available())  # MPS runs here, where a worker has a gpu_share
    spec = spec.model_copy(
        update={
            "backend": placement.backend,
            "precisions": placement.precisions,
            "submitted_at": spec.submitted_at or time.time(),
        }
    )
    if spec.cluster.launcher == "ray":
        from hetflow.training.launch.ray_train import run_workers_ray, with_shared_state

        return run_workers_ray(with_shared_state(spec), timeout_s, max_restarts)
    run_dir = Path(spec.run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    job = spec.write(run_dir / "job.json")
    cmd = torchrun_command(
        job,
        spec.cluster.world_size,
        f"127.0.0.1:{free_port()}",
        rdzv_id=spec.run_name,
        max_restarts=max_restarts,
    )
    watch = JobWatch(run_dir, spec.train.stall_timeout_s)
    log = run_dir / "workers.log"
    t = time.perf_counter()
    with log.open("wb") as out, mps_daemon(spec.cluster, worker_env(spec)) as env:
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, env=env)
        try:
            _watch(proc, watch, run_dir, t + timeout_s, on_progress)
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
    return json.loads((run_dir / "result.json").read_text()), wall


def _watch(proc: subprocess.Popen, watch: JobWatch, run_dir: Path, deadline: float, on_progress):
    """Until torchrun exits: raise on a rank's failure or past the deadline, kill stalled
    ranks, report progress."""
    progress = run_dir / "progress.json"
    last_report = 0.0
    while proc.poll() is None:
        now = time.perf_counter()
        if now > deadline:
            raise LaunchError(f"torchrun ran past its deadline (log: {run_dir / 'workers.log'})")
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


def measure_profile(
    cluster: ClusterSpec,
    dataset: DatasetSpec,
    train: TrainConfig,
    run_dir: str | Path,
    profile_batches: list[int] | None = None,
) -> Profile:
    """Every worker of `cluster` measured inside it (a torchrun job with mode="profile", its
    files under `run_dir`): the `Profile` the planner and the simulator read. `profile_batches`:
    the batches each step is timed at (default: `default_profile_batches` of this cluster)."""
    run_dir = Path(run_dir)
    spec = RunSpec(
        run_name=run_dir.name,
        variant="profile",
        mode="profile",
        cluster=cluster,
        dataset=dataset,
        train=train,
        run_dir=str(run_dir),
        profile_batches=profile_batches,
    )
    result, wall = run_workers(spec)
    return Profile.from_result(result, cluster, train.recipe, profiling_time_s=wall)
