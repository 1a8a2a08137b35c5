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
from hetflow.training.job import RunSpec


class LaunchError(RuntimeError):
    """torchrun exited non-zero; the message carries the tail of the workers' output."""


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

    torchrun restarts the workers up to `max_restarts` times when one dies; they resume from
    the last checkpoint. `on_progress(step)` is called about once a second with the last
    completed step (from rank 0's progress.json).
    """
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
    env = worker_env(spec)
    log = run_dir / "workers.log"
    t = time.perf_counter()
    progress = run_dir / "progress.json"
    with log.open("wb") as out:
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, env=env)
        try:
            while proc.poll() is None:
                if time.perf_counter() - t > timeout_s:
                    proc.kill()
                    raise LaunchError(f"torchrun ran past {timeout_s:.0f}s (log: {log})")
                if on_progress is not None and progress.exists():
                    try:
                        on_progress(json.loads(progress.read_text())["step"])
                    except (ValueError, KeyError):
                        pass
                try:
                    proc.wait(timeout=1.0)
                except subprocess.TimeoutExpired:
                    pass
        except BaseException:
            proc.kill()
            raise
    wall = time.perf_counter() - t
    if proc.returncode != 0:
        tail = log.read_text(errors="replace").strip().splitlines()[-15:]
        raise LaunchError(f"torchrun exited {proc.returncode} (log: {log}):\n" + "\n".join(tail))
    return json.loads((run_dir / "result.json").read_text()), wall


def measure_profile(
    cluster: ClusterSpec, dataset: DatasetSpec, train: TrainConfig, run_dir: str | Path
) -> Profile:
    """Every worker of `cluster` measured inside it (a torchrun job with mode="profile", its
    files under `run_dir`): the `Profile` the planner and the simulator read."""
    run_dir = Path(run_dir)
    spec = RunSpec(
        run_name=run_dir.name,
        variant="profile",
        mode="profile",
        cluster=cluster,
        dataset=dataset,
        train=train,
        run_dir=str(run_dir),
    )
    result, wall = run_workers(spec)
    return Profile.from_result(result, cluster, train.recipe, profiling_time_s=wall)
