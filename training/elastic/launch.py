"""The launcher of a job under `faults.on_loss: continue` on this machine (`run_elastic`): one
process per worker, started and watched by the launcher itself, which also hosts the job's
TCPStore.

Not torchrun: its agent stops every worker of the group as soon as one fails, and restarts
them all (`--max-restarts`), which is the relaunch this mode avoids. Here a worker's end is a
notice in the store (`world.PREFIX` `dead/R`, `deaths`), which the ranks left read to regroup
without it; the store lives in the launcher, so it outlives any rank. A rank the others
regrouped without while it was still alive (it stalled past the collective timeout) is killed.
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import time
from datetime import timedelta
from pathlib import Path

import torch.distributed as dist

from hetflow.config import STATELESS_HOOKS, ConfigError, check_on_loss
from hetflow.infra.s3 import free_port
from hetflow.training.cpu_quota import JobCgroups, find_controller
from hetflow.training.elastic.world import PREFIX
from hetflow.training.faults.watch import JobWatch, _kill
from hetflow.training.launch.live import Processes, registered
from hetflow.training.launch.mps import mps_daemon
from hetflow.training.launch.outcome import Launched, LaunchError, RankFailed
from hetflow.training.launch.spec import RunSpec


def check_elastic(spec: RunSpec) -> None:
    """A one-line ConfigError where `on_loss: continue` cannot run `spec`
    (`config.rules.check_on_loss`), its plan's comm hook included."""
    check_on_loss(spec.cluster, spec.train)
    method = spec.plan.compression if spec.plan else None
    if method is not None and method.name not in STATELESS_HOOKS:
        raise ConfigError(
            f"train.faults.on_loss: 'continue' needs compression none, fp16 or bf16, not "
            f"the plan's {method.name!r}"
        )


def rank_env(spec: RunSpec, rank: int, port: int) -> dict[str, str]:
    """What torchrun would give rank `rank` of a one-node job, the store being the launcher's."""
    world = str(spec.cluster.world_size)
    return {
        **os.environ,
        "OMP_NUM_THREADS": str(spec.train.threads_per_rank),
        "RANK": str(rank),
        "LOCAL_RANK": str(rank),
        "WORLD_SIZE": world,
        "LOCAL_WORLD_SIZE": world,
        "MASTER_ADDR": "127.0.0.1",
        "MASTER_PORT": str(port),
        "TORCHELASTIC_USE_AGENT_STORE": "True",
        "TORCHELASTIC_RESTART_COUNT": "0",
    }


def run_elastic(spec: RunSpec, timeout_s: float = 1800, on_progress=None) -> Launched:
    """Write the job file, start one worker process per rank, watch them to the end; the
    result (rank 0's result.json) and the wall seconds. A rank that raises ends the job
    (`RankFailed`, as under torchrun); a rank's process that ends otherwise is announced to
    the others, which go on without it. `spec` comes checked and placed by
    `launch.run.run_workers`."""
    check_elastic(spec)
    run_dir = Path(spec.run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    job = spec.write(run_dir / "job.json")
    port = free_port()
    store = dist.TCPStore(
        "127.0.0.1",
        port,
        None,
        is_master=True,
        timeout=timedelta(seconds=60),
        wait_for_workers=False,
    )
    watch = JobWatch(run_dir, spec.train.stall_timeout_s)
    log = run_dir / "workers.log"
    t = time.perf_counter()
    cgroups = JobCgroups.of(spec.cluster, spec.run_name, find_controller())
    cmd = [sys.executable, "-m", "hetflow.training.worker", "--job", str(job)]
    with log.open("wb") as out, cgroups or contextlib.nullcontext():
        with mps_daemon(spec.cluster, rank_env(spec, 0, port)) as env0:
            procs = {}
            for r in range(spec.cluster.world_size):
                env = {**env0, **rank_env(spec, r, port)}
                procs[r] = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, env=env)
            try:
                names = [w.name for w in spec.cluster.workers]
                with registered(run_dir, Processes(procs, names)):  # the queue's moves in place
                    _watch(procs, store, watch, run_dir, t + timeout_s, on_progress)
            finally:
                for p in procs.values():
                    if p.poll() is None:
                        _kill(p.pid)
                        p.wait()
    wall = time.perf_counter() - t
    result = run_dir / "result.json"
    if not result.exists():
        tail = log.read_text(errors="replace").strip().splitlines()[-15:]
        codes = {r: p.returncode for r, p in procs.items()}
        why = "no result"
        if all(c != 0 for c in codes.values()):
            why = (
                f"every worker of the job was lost; its checkpoints (the last of them "
                f"resumes it) are in {spec.checkpoint_url or run_dir / 'checkpoints'}"
            )
        raise LaunchError(f"{why} (exit codes {codes}; log: {log}):\n" + "\n".join(tail))
    return Launched(json.loads(result.read_text()), wall)


def _watch(procs: dict, store, watch: JobWatch, run_dir: Path, deadline: float, on_progress):
    """Until every rank's process has ended: raise on a rank's failure or past the deadline;
    announce each member that ended with a non-zero status (`dead/R`, `deaths`); kill a live
    rank the newest generation left out (a stalled one), unannounced; report progress about
    once a second."""
    announced: set[int] = set()
    progress, last_report = run_dir / "progress.json", 0.0
    while [p.poll() for p in procs.values()].count(None):  # each polled: its status set
        now = time.perf_counter()
        if now > deadline:
            raise LaunchError(f"the job ran past its deadline (log: {run_dir / 'workers.log'})")
        failure = watch.fatal()
        if failure is not None:
            raise RankFailed(failure, run_dir / "workers.log")
        for r, p in procs.items():
            if p.returncode not in (None, 0) and r not in announced:
                announced.add(r)
                store.set(f"{PREFIX}/dead/{r}", "1")
                store.add(f"{PREFIX}/deaths", 1)
                print(f"rank {r} ended (status {p.returncode}); the others go on", flush=True)
        for r in left_out(store, procs):  # no member's death: not announced
            announced.add(r)
            _kill(procs[r].pid)
        if on_progress is not None and progress.exists() and now - last_report >= 1.0:
            last_report = now
            with contextlib.suppress(ValueError, KeyError, OSError):
                on_progress(json.loads(progress.read_text())["step"])
        time.sleep(0.05)


def left_out(store, procs: dict) -> list[int]:
    """The live ranks that the newest generation's members do not include."""
    if not store.check([f"{PREFIX}/gen"]):
        return []
    gen = int(store.get(f"{PREFIX}/gen"))
    members = json.loads(store.get(f"{PREFIX}/g{gen}/members"))
    return [r for r, p in procs.items() if p.poll() is None and r not in members]
