"""Each worker's share of the CPU, enforced by the kernel (`WorkerSpec.cpu_quota`): workers of
different real speeds on one host, with nothing of hetflow's model shaping them.

A worker's quota is a fraction of one core (0.25: a quarter of a core's time in every period),
enforced by the CFS bandwidth controller of a cgroup of its own: cgroup v1's
`cpu.cfs_quota_us` / `cpu.cfs_period_us`, or cgroup v2's `cpu.max`, whichever this host mounts.
Its torch threads are set to match (a quarter of a core runs one thread; 2.5 cores run three).

The life of a job's cgroups (`JobCgroups`):

- before launch, `check_quotas` refuses in one line, naming the worker and what is missing (no
  CPU controller mounted, not allowed to write it, more cores than the host has);
- the launcher creates one cgroup per rank that asks for a quota, `<controller>/hetflow/<run>/
  rank<r>`, its quota written (`JobCgroups.create`);
- each rank moves its own process into its cgroup before its first torch operation
  (`join_quota`; where the launcher could not create it first, as on a Ray node of another
  host, the rank creates it);
- the launcher removes them after the job, whether it ended well or a rank died
  (`JobCgroups.remove`); a rank's cgroup left behind on another host (its job killed with the
  node) is removed by the next job that creates one there and finds it empty (`sweep`).

Written for hetflow: torch, torchrun and Ray have no per-rank CPU quota (Ray's `num_cpus` is a
scheduling count, not a limit the kernel enforces), and the cgroup files are the kernel's own
interface, so no library stands between them.
"""

from __future__ import annotations

import math
import os
import time
from dataclasses import dataclass
from pathlib import Path

from hetflow.config import ClusterSpec, ConfigError

# The CFS period: 10 ms, not the kernel's default of 100 ms, so that a quarter of a core runs
# 2.5 ms in every 10 rather than 25 in every 100: a step of a few tens of milliseconds then
# sees its quota as a slower core, not as bursts at full speed and stalls. The kernel refuses
# a quota under 1 ms, hence `WorkerSpec.cpu_quota` >= 0.1.
PERIOD_US = 10_000
GROUP = "hetflow"  # every job's cgroups under this one, in the CPU controller's hierarchy
STALE_S = 60.0  # an empty rank cgroup this old belongs to no job that is still starting
MOUNTS = Path("/proc/self/mounts")


@dataclass(frozen=True)
class Controller:
    """Where this host's CPU controller is mounted and which cgroup version it speaks."""

    root: Path
    version: int  # 1 or 2

    def quota_files(self, quota: float) -> dict[str, str]:
        """The files that set a quota of `quota` cores, and what each gets (pure).

        >>> Controller(Path("/c"), 1).quota_files(0.25)
        {'cpu.cfs_period_us': '10000', 'cpu.cfs_quota_us': '2500'}
        >>> Controller(Path("/c"), 2).quota_files(1.5)
        {'cpu.max': '15000 10000'}
        """
        us = max(1000, round(quota * PERIOD_US))
        if self.version == 1:
            return {"cpu.cfs_period_us": str(PERIOD_US), "cpu.cfs_quota_us": str(us)}
        return {"cpu.max": f"{us} {PERIOD_US}"}

    def job_dir(self, run_name: str) -> Path:
        return self.root / GROUP / run_name

    def rank_dir(self, run_name: str, rank: int) -> Path:
        return self.job_dir(run_name) / f"rank{rank}"

    def make(self, path: Path) -> None:
        """Create `path` (and the cgroups above it); under v2, each parent hands the CPU
        controller down to its children (`cgroup.subtree_control`)."""
        if self.version == 2:
            for parent in reversed([p for p in path.parents if self.root in p.parents]):
                parent.mkdir(exist_ok=True)
                _enable_cpu(parent)
            _enable_cpu(self.root)
        path.mkdir(parents=True, exist_ok=True)

    def read_quota(self, path: Path) -> float | None:
        """The quota in cores that `path` enforces, None for none."""
        if self.version == 1:
            quota = int((path / "cpu.cfs_quota_us").read_text())
            period = int((path / "cpu.cfs_period_us").read_text())
        else:
            text, period_text = (path / "cpu.max").read_text().split()
            if text == "max":
                return None
            quota, period = int(text), int(period_text)
        return None if quota < 0 else quota / period


def _enable_cpu(path: Path) -> None:
    control = path / "cgroup.subtree_control"
    if "cpu" not in control.read_text().split():
        control.write_text("+cpu")


def find_controller(mounts: Path = MOUNTS) -> Controller | None:
    """This host's CPU controller: a cgroup v1 hierarchy mounted with the `cpu` option, else
    the v2 hierarchy where `cpu` is among its controllers; None where neither is mounted."""
    try:
        lines = mounts.read_text().splitlines()
    except OSError:
        return None
    v2 = None
    for line in lines:
        fields = line.split()
        if len(fields) < 4:
            continue
        where, kind, options = Path(fields[1]), fields[2], fields[3].split(",")
        if kind == "cgroup" and "cpu" in options and (where / "cpu.cfs_quota_us").exists():
            return Controller(where, 1)
        if kind == "cgroup2" and v2 is None:
            controllers = where / "cgroup.controllers"
            if controllers.exists() and "cpu" in controllers.read_text().split():
                v2 = Controller(where, 2)
    return v2


def threads_for(quota: float) -> int:
    """Torch threads for a worker of `quota` cores: as many as the cores it may use, at least one.

    >>> threads_for(0.25), threads_for(1.0), threads_for(2.5)
    (1, 1, 3)
    """
    return max(1, math.ceil(quota - 1e-9))


def check_quotas(
    cluster: ClusterSpec, cores: int | None = None, mounts: Path = MOUNTS
) -> Controller | None:
    """The controller the workers' `cpu_quota`s will be written to (None where no worker asks for
    one), or a one-line ConfigError naming the first such worker and what this host lacks: a
    CPU controller, the right to write it (root, or a delegated hierarchy), or `cores` enough
    for its quota (local launcher: every rank on this host). The controller is found from
    `mounts` (`find_controller`)."""
    asking = [w for w in cluster.workers if w.cpu_quota is not None]
    if not asking:
        return None
    first = f"cluster.workers[{asking[0].name}].cpu_quota"
    found = find_controller(mounts)
    if found is None:
        raise ConfigError(
            f"{first}: this host mounts no cgroup CPU controller (cgroup v1 'cpu' or v2 with "
            "'cpu' in cgroup.controllers): kernel CPU quotas are not available here"
        )
    group = found.root / GROUP
    writable = group if group.exists() else found.root
    if not os.access(writable, os.W_OK):
        raise ConfigError(
            f"{first}: {writable} is not writable by this user (uid {os.geteuid()}): CPU "
            "quotas need root or a cgroup delegated to this user"
        )
    if cores is not None and cluster.launcher == "local":
        for w in asking:
            if w.cpu_quota > cores:
                raise ConfigError(
                    f"cluster.workers[{w.name}].cpu_quota: {w.cpu_quota:g} cores asked, this "
                    f"host has {cores}"
                )
    return found


@dataclass(frozen=True)
class JobCgroups:
    """One job's rank cgroups, made by its launcher before the ranks start and removed after."""

    controller: Controller
    run_name: str
    quotas: dict[int, float]  # rank -> cores

    @classmethod
    def of(cls, cluster: ClusterSpec, run_name: str, controller: Controller | None):
        """The job's cgroups where a worker asks for a quota and `controller` is found."""
        quotas = {r: w.cpu_quota for r, w in enumerate(cluster.workers) if w.cpu_quota}
        return cls(controller, run_name, quotas) if quotas and controller else None

    def create(self) -> None:
        sweep(self.controller)
        for rank, quota in self.quotas.items():
            make_rank_cgroup(self.controller, self.run_name, rank, quota)

    def remove(self) -> None:
        """Remove every rank cgroup of the job, then the job's; a cgroup that still holds a
        process (a rank not yet reaped) is retried for a few seconds, then left to `sweep`."""
        job = self.controller.job_dir(self.run_name)
        deadline = time.monotonic() + 5.0
        for path in [*sorted(job.glob("rank*")), job]:
            while path.exists():
                try:
                    path.rmdir()
                except FileNotFoundError:
                    break
                except OSError:
                    if time.monotonic() > deadline:
                        break
                    time.sleep(0.1)

    def __enter__(self) -> JobCgroups:
        self.create()
        return self

    def __exit__(self, *exc) -> None:
        self.remove()


def make_rank_cgroup(controller: Controller, run_name: str, rank: int, quota: float) -> Path:
    """Rank `rank`'s cgroup of job `run_name`, its quota of `quota` cores written."""
    path = controller.rank_dir(run_name, rank)
    controller.make(path)
    for name, value in controller.quota_files(quota).items():
        (path / name).write_text(value)
    return path


def sweep(controller: Controller, older_than_s: float = STALE_S) -> None:
    """Remove the rank and job cgroups under hetflow's that hold no process and were made
    more than `older_than_s` ago: those of jobs that ended without their launcher's clean-up
    (a node lost with its job). A cgroup still in use refuses its removal and stays."""
    now = time.time()
    for job in (controller.root / GROUP).glob("*"):
        for path in [*job.glob("rank*"), job]:
            try:
                if now - path.stat().st_mtime > older_than_s:
                    path.rmdir()
            except OSError:
                pass


def join_quota(cluster: ClusterSpec, rank: int, run_name: str) -> float | None:
    """Move this process into its rank's cgroup (made here if the launcher did not: a Ray node of
    another host; its quota written anew) and set its torch threads to match its quota; the quota,
    None where the worker has none. Call it before the first torch operation: threads made before
    the move stay where they were under cgroup v1's `tasks`, so the process moves as one
    (`cgroup.procs`)."""
    import torch

    quota = cluster.workers[rank].cpu_quota
    if quota is None:
        return None
    controller = find_controller()
    if controller is None:
        raise ConfigError(
            f"cluster.workers[{cluster.workers[rank].name}].cpu_quota: this rank's host mounts "
            "no cgroup CPU controller"
        )
    # written again even where the launcher made it: a group re-formed without a worker
    # numbers its ranks anew
    path = make_rank_cgroup(controller, run_name, rank, quota)
    (path / "cgroup.procs").write_text(str(os.getpid()))
    threads = threads_for(quota)
    if torch.get_num_threads() > threads:
        torch.set_num_threads(threads)
    return quota


def own_quota() -> float | None:
    """The CPU quota, in cores, of the cgroup this process is in (None: none, or no controller):
    what a rank reports it ran under, read from the kernel, not from its config."""
    controller = find_controller()
    if controller is None:
        return None
    for line in Path("/proc/self/cgroup").read_text().splitlines():
        _, names, where = line.split(":", 2)
        if (controller.version == 1 and "cpu" in names.split(",")) or (
            controller.version == 2 and names == ""
        ):
            try:
                return controller.read_quota(controller.root / where.lstrip("/"))
            except (OSError, ValueError):
                return None
    return None
