"""The launcher of a job under `faults.on_loss: continue` on this machine: one process per
worker, started and watched by the launcher itself (`ElasticJob`), which also hosts the job's
TCPStore. `start_elastic(spec)` hands back the running job: `add_worker` grows it in place,
`release` lets one of its workers go in place, `wait` watches it to the end (`run_elastic` is
the three in one, for a job nobody grows or shrinks). A rank's process is a warm worker
where one waits (`pool`): the session's pool for every rank where one is open, else the
job's own for its joiners; a new process otherwise.

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
import signal
import subprocess
import sys
import threading
import time
from datetime import timedelta
from pathlib import Path

import torch.distributed as dist

from hetflow.config import STATELESS_HOOKS, ConfigError, WorkerSpec, check_on_loss
from hetflow.infra.s3 import free_port
from hetflow.training.cpu_quota import JobCgroups, find_controller
from hetflow.training.elastic.pool import COMMAND, current
from hetflow.training.elastic.world import JOINING, PREFIX
from hetflow.training.faults.watch import JobWatch, _kill
from hetflow.training.launch.live import Handle, registered
from hetflow.training.launch.mps import mps_daemon
from hetflow.training.launch.outcome import Launched, LaunchError, RankFailed
from hetflow.training.launch.pool import WarmPool
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


def first_ranks(spec: RunSpec) -> list[int]:
    """The ranks that start the job: every slot of the cluster but the late ones
    (`faults.join_at`) and the spare ones (`faults.spare`, joinable only by `add_worker`)."""
    faults = spec.train.faults
    names = [w.name for w in spec.cluster.workers]
    return [r for r, n in enumerate(names) if r not in faults.join_at and n not in faults.spare]


def rank_env(spec: RunSpec, rank: int, port: int) -> dict[str, str]:
    """What torchrun would give rank `rank` of a one-node job, the store being the launcher's.
    Gloo connects a group's ranks at its first collective (`TORCH_GLOO_LAZY_INIT`), not when it
    is made: the job's default group spans every slot of the cluster, some of which start late
    or never (`ElasticJob.add_worker`), and only the generations' groups are used."""
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
        "TORCH_GLOO_LAZY_INIT": "1",
    }


def run_elastic(spec: RunSpec, timeout_s: float = 1800, on_progress=None) -> Launched:
    """`start_elastic(spec)`, then `wait()`: the result (the leader's result.json) and the
    wall seconds. `spec` comes checked and placed by `launch.run.run_workers`. The running
    job is findable by its run directory meanwhile (`launch.live`: the queue's moves)."""
    job = start_elastic(spec, timeout_s, on_progress)
    with registered(spec.run_dir, Handle(job)):
        return job.wait()


def start_elastic(spec: RunSpec, timeout_s: float = 1800, on_progress=None) -> ElasticJob:
    """Write the job file, host its store, start the worker process of each rank that starts
    the job (`first_ranks`: not those `faults.join_at` starts late, nor `faults.spare`);
    the handle of the running job, which `wait` watches to its end (within `timeout_s`,
    `on_progress(step)` about once a second)."""
    check_elastic(spec)
    job = ElasticJob(spec, timeout_s, on_progress)
    job.start()
    return job


class ElasticJob:
    """A running job under `on_loss: continue`: its workers' processes by rank, its store.

    Every rank is a slot of the job's cluster (`spec.cluster.workers`): the job has at most as
    many workers as it lists, as torchrun's `--nnodes MIN:MAX` has at most MAX. A slot is free
    before its worker starts (`faults.join_at`), and after its worker left or was lost.
    `add_worker` and `release` may be called from any thread while another runs `wait`."""

    def __init__(self, spec: RunSpec, timeout_s: float = 1800, on_progress=None) -> None:
        self.spec, self.run_dir = spec, Path(spec.run_dir)
        self.timeout_s, self.on_progress = timeout_s, on_progress
        self.procs: dict[int, subprocess.Popen] = {}
        self.joining: set[int] = set()  # started to join, not yet in a generation
        self.pool: WarmPool | None = None  # the job's own warm workers, for its joiners
        self.shared = current()  # a session's pool, open around the job: every rank's process
        self.replacing: set[int] = set()  # lost ranks whose replacement is due (`replace`)
        self.replaced = 0
        self.holders: dict[int, str] = {}  # rank -> the worker its newest process runs as
        self.late = dict(spec.train.faults.join_at)  # rank -> the step that starts it
        self.lock = threading.Lock()
        self._stack = contextlib.ExitStack()
        self.store = None

    def start(self) -> None:
        """The job file, the store and the cgroups; the first generation's ranks started."""
        spec = self.spec
        self.run_dir.mkdir(parents=True, exist_ok=True)
        self.job = spec.write(self.run_dir / "job.json")
        port = free_port()
        self.store = dist.TCPStore(
            "127.0.0.1",
            port,
            None,
            is_master=True,
            timeout=timedelta(seconds=60),
            wait_for_workers=False,
        )
        first = first_ranks(spec)
        self.store.set(f"{PREFIX}/g0/members", json.dumps({"ranks": first, "leader": first[0]}))
        self.watch = JobWatch(self.run_dir, spec.train.stall_timeout_s)
        self.t0 = time.perf_counter()
        log = self.run_dir / "workers.log"
        log.write_bytes(b"")  # appended to by every rank, a warm worker's too (`warm`)
        self.out = self._stack.enter_context(log.open("ab"))
        cgroups = JobCgroups.of(spec.cluster, spec.run_name, find_controller())
        if cgroups is not None:
            self._stack.enter_context(cgroups)
        self.env0 = self._stack.enter_context(mps_daemon(spec.cluster, rank_env(spec, 0, port)))
        self.port = port
        self.pool = WarmPool(0, COMMAND, self.env0, self.out, refill=False)
        for r in first:
            self._spawn(r)
        faults = spec.train.faults
        self.keep_warm(len(self.late) + faults.warm_workers + int(faults.replace))

    def _spawn(self, rank: int, joining: bool = False, worker: str = "") -> None:
        """Start rank `rank`'s worker, as the worker named `worker` (else the slot's: the
        store's `worker/R`, which the rank records in its result); `joining`: into the
        running job, the slot's notices of an earlier worker in it cleared first, on a warm
        worker where one waits (`warm`)."""
        if joining:
            for key in (f"dead/{rank}", f"join/{rank}", f"admit/{rank}"):
                self.store.delete_key(f"{PREFIX}/{key}")
        name = worker or self.spec.cluster.workers[rank].name
        self.store.set(f"{PREFIX}/worker/{rank}", name)
        env = {**self.env0, **rank_env(self.spec, rank, self.port)}
        if joining:
            env[JOINING] = "1"
        with self.lock:
            pool = self.shared or (self.pool if joining else None)
            fields = {"job": str(self.job), "log": self.out.name}
            proc = pool.take(fields, env, "join" if joining else "") if pool else None
            warm = proc is not None
            if proc is None:
                cmd = [sys.executable, "-m", "hetflow.training.worker", "--job", str(self.job)]
                proc = subprocess.Popen(cmd, stdout=self.out, stderr=subprocess.STDOUT, env=env)
            self.procs[rank], self.holders[rank] = proc, name
            if joining:
                self.joining.add(rank)
        how = f"{' to join' if joining else ''}{' on a warm worker' if warm else ''}"
        print(f"rank {rank} started{how} (pid {proc.pid})", flush=True)

    def keep_warm(self, count: int) -> None:
        """Keep `count` warm workers (`warm`) of the job's own waiting for its joiners; none
        where a session's pool is open (`pool.session_pool`: it serves every rank)."""
        if self.shared is None:
            self.pool.resize(count)

    def free_slots(self) -> list[int]:
        """The ranks of the cluster no live process holds."""
        with self.lock:
            busy = {r for r, p in self.procs.items() if p.poll() is None}
        return [r for r in range(self.spec.cluster.world_size) if r not in busy]

    def add_worker(self, worker: WorkerSpec) -> int:
        """Start a worker in the free slot of the cluster named `worker.name` (else the first
        free slot of the same instance type, preset and speed); it joins the running job in
        place at a step boundary, taking a share from the next step on. Returns its rank.
        Raises ValueError where no slot fits."""
        workers, free = self.spec.cluster.workers, self.free_slots()
        fits = [r for r in free if workers[r].name == worker.name] or [
            r
            for r in free
            if (workers[r].instance_type, workers[r].preset, workers[r].speed)
            == (worker.instance_type, worker.preset, worker.speed)
        ]
        if not fits:
            raise ValueError(
                f"no free slot of the job's cluster fits worker {worker.name!r} (free: "
                f"{[workers[r].name for r in free]})"
            )
        rank = fits[0]
        self._spawn(rank, joining=True, worker=worker.name)
        self.keep_warm(self.spec.train.faults.warm_workers + int(self.spec.train.faults.replace))
        return rank

    def release(self, rank: int) -> None:
        """Ask the worker of `rank` to leave in place at its next step boundary (as a SIGTERM
        does: `departure.Departures`); the others go on without it. A no-op where it ended."""
        with self.lock:
            proc = self.procs.get(rank)
        if proc is None:
            raise ValueError(f"rank {rank} is not a worker of this job")
        if proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(proc.pid, signal.SIGTERM)

    def wait(self) -> Launched:
        """Watch every worker to its end: the result (the leader's result.json) and the wall
        seconds since the start. A rank that raises ends the job (`RankFailed`, as under
        torchrun); a rank's process that ends otherwise is announced to the others, which go
        on without it."""
        try:
            self._watch(self.t0 + self.timeout_s)
        finally:
            with self.lock:
                procs = list(self.procs.values())
            if self.pool is not None:
                self.pool.close()
            for p in procs:
                if p.poll() is None:
                    _kill(p.pid)
                    p.wait()
            self._stack.close()
        return self._outcome(time.perf_counter() - self.t0)

    def _outcome(self, wall: float) -> Launched:
        result, log = self.run_dir / "result.json", self.run_dir / "workers.log"
        if result.exists():
            return Launched(json.loads(result.read_text()), wall)
        tail = log.read_text(errors="replace").strip().splitlines()[-15:]
        codes = {r: p.returncode for r, p in self.procs.items()}
        why = "no result"
        if all(c != 0 for c in codes.values()):
            where = self.spec.checkpoint_url or self.run_dir / "checkpoints"
            why = (
                f"every worker of the job was lost; its checkpoints (the last of them "
                f"resumes it) are in {where}"
            )
        raise LaunchError(f"{why} (exit codes {codes}; log: {log}):\n" + "\n".join(tail))

    def _watch(self, deadline: float) -> None:
        """Until every rank's process has ended: raise on a rank's failure or past the
        deadline; announce each member that ended with a non-zero status (`dead/R`,
        `deaths`); kill a live rank the newest generation left out (a stalled one),
        unannounced; start the late workers whose step came; report progress about once a
        second. A joiner that ends before any generation took it is marked dead (no
        generation waits for it) but not counted (no member's step is aborted for it)."""
        announced: set[int] = set()
        progress, last_report = self.run_dir / "progress.json", 0.0
        while self._running():
            now = time.perf_counter()
            if now > deadline:
                raise LaunchError(f"the job ran past its deadline (log: {self.out.name})")
            failure = self.watch.fatal()
            if failure is not None:
                raise RankFailed(failure, Path(self.out.name))
            with self.lock:
                procs = dict(self.procs)
            for r, p in procs.items():
                if p.returncode not in (None, 0) and (r, p.pid) not in announced:
                    announced.add((r, p.pid))
                    self.store.set(f"{PREFIX}/dead/{r}", "1")
                    if r not in self.joining:  # a joiner not yet in: no member's step waits
                        self.store.add(f"{PREFIX}/deaths", 1)
                    print(f"rank {r} ended (status {p.returncode}); the others go on", flush=True)
                    self._to_replace(r)
            self._start_late()
            for r in left_out(self.store, procs, self.joining):  # not announced
                announced.add((r, procs[r].pid))
                _kill(procs[r].pid)
                self._to_replace(r)
            self._replace_lost()
            if self.on_progress is not None and progress.exists() and now - last_report >= 1.0:
                last_report = now
                with contextlib.suppress(ValueError, KeyError, OSError):
                    self.on_progress(json.loads(progress.read_text())["step"])
            time.sleep(0.05)

    def _to_replace(self, rank: int) -> None:
        """Where `faults.replace` is on and replacements are left (`group_restarts` in all),
        a replacement of lost `rank` is due (`_replace_lost` starts it)."""
        faults = self.spec.train.faults
        if faults.replace and self.replaced < faults.group_restarts:
            self.replaced += 1
            self.replacing.add(rank)

    def _replace_lost(self) -> None:
        """Start the replacements due whose rank the newest generation left out (its members
        have seen the loss: a replacement clears the slot's notices), each joining in place."""
        if not self.replacing or not self.store.check([f"{PREFIX}/gen"]):
            return
        gen = int(self.store.get(f"{PREFIX}/gen"))
        members = json.loads(self.store.get(f"{PREFIX}/g{gen}/members"))["ranks"]
        for r in [r for r in self.replacing if r not in members]:
            self.replacing.discard(r)
            self._spawn(r, joining=True)

    def _start_late(self) -> None:
        """Start each late worker (`faults.join_at`) whose step the job has reached."""
        if not self.late:
            return
        with contextlib.suppress(ValueError, KeyError, OSError):
            step = json.loads((self.run_dir / "progress.json").read_text())["step"]
            for r in [r for r, at in self.late.items() if step >= at]:
                del self.late[r]
                self._spawn(r, joining=True)

    def _running(self) -> bool:
        with self.lock:
            return [p.poll() for p in self.procs.values()].count(None) > 0


def left_out(store, procs: dict, joining: set[int]) -> list[int]:
    """The live ranks that the newest generation's members do not include, but those still
    asking to join (`joining`, from which a rank in that generation is taken out)."""
    if not store.check([f"{PREFIX}/gen"]):
        return []
    gen = int(store.get(f"{PREFIX}/gen"))
    members = json.loads(store.get(f"{PREFIX}/g{gen}/members"))["ranks"]
    joining -= set(members)
    return [r for r, p in procs.items() if p.poll() is None and r not in set(members) | joining]
