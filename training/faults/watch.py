"""What the launcher sees of a torchrun job's ranks while it runs, and what it does about it.

Each rank writes its pid at start and a `RankFailure` before it exits on an exception
(`hetflow.training.faults.records`, under RUN_DIR/ranks/attempt-A/). The launcher polls them:

- the first 'error' or 'nonfinite' record ends the job at once (`JobWatch.fatal`): an
  exception in a rank's own code is deterministic, and torchrun would only restart it;
- a collective that timed out means a rank stalled (stopped, a hung read): the ranks that time
  out write 'timed_out'; the one that did not answer writes nothing. After a short grace the
  silent ranks are named and killed (`JobWatch.stalled`), and torchrun restarts the group
  from the last checkpoint (or, out of restarts, the run fails naming them).
"""

from __future__ import annotations

import shutil
import signal
import time
from pathlib import Path

import psutil

from hetflow.training.faults.records import RankFailure, ranks_dir

FATAL = ("error", "nonfinite")


class JobWatch:
    def __init__(self, run_dir: str | Path, stall_timeout_s: float) -> None:
        """Clears the records of an earlier launch in the same run directory (a retried task)."""
        self.root = ranks_dir(run_dir)
        shutil.rmtree(self.root, ignore_errors=True)
        self.stall_timeout_s = stall_timeout_s
        # The other ranks time out within about a step of the first one.
        self.grace_s = min(5.0, max(1.0, stall_timeout_s / 2))
        self.stalls: list[str] = []
        self._handled: set[str] = set()

    def failures(self, folder: Path | None = None) -> list[RankFailure]:
        """Every rank's failure record (of one attempt's folder, if given), oldest first."""
        paths = (folder or self.root).glob("**/rank*.failure.json")
        found = []
        for path in paths:
            try:
                found.append(RankFailure.model_validate_json(path.read_text()))
            except (OSError, ValueError):
                continue  # a rename in progress
        return sorted(found, key=lambda f: f.time)

    def fatal(self) -> RankFailure | None:
        """The first failure of a rank's own (the root cause; the others' collectives fail
        after it exits), or None."""
        return next((f for f in self.failures() if f.kind in FATAL), None)

    def stalled(self, job_pids: set[int]) -> list[str]:
        """Name and kill (SIGKILL: a stopped process ignores SIGTERM) the ranks that did not
        answer a collective the others timed out in; returns the new lines naming them."""
        lines = []
        for folder in sorted(self.root.glob("attempt-*")):
            failures = self.failures(folder)
            timed = [f for f in failures if f.kind == "timed_out"]
            if folder.name in self._handled or not timed:
                continue
            if time.time() - timed[0].time < self.grace_s:
                continue
            self._handled.add(folder.name)
            answered = {f.rank for f in failures}
            for path in sorted(folder.glob("rank*.pid")):
                rank, pid = int(path.stem.removeprefix("rank")), int(path.read_text())
                if rank in answered:
                    continue
                lines.append(
                    f"rank {rank} stalled at step {timed[0].step}: no answer in a collective "
                    f"for {self.stall_timeout_s:g} s (rank {timed[0].rank} timed out); killed, "
                    "torchrun restarts the group from the last checkpoint"
                )
                if pid in job_pids:
                    _kill(pid)
        self.stalls += lines
        return lines


def job_pids(pid: int) -> set[int]:
    """The torchrun agent `pid` and every process under it (the workers)."""
    try:
        agent = psutil.Process(pid)
        return {pid, *(p.pid for p in agent.children(recursive=True))}
    except psutil.NoSuchProcess:
        return set()


# The signal on which a rank (and the warm agent) writes every thread's Python stack to its
# log (`faulthandler.register`, `dump_on_signal`): what a job past its deadline was doing.
STACKS_SIGNAL = signal.SIGUSR1


def dump_on_signal() -> None:
    """Have this process write every thread's stack to stderr on STACKS_SIGNAL (the
    standard library's `faulthandler`; its other handlers are left as they are)."""
    import faulthandler

    faulthandler.register(STACKS_SIGNAL, all_threads=True)


def dump_stacks(pid: int, agent: bool = False, wait_s: float = 2.0) -> None:
    """Ask the processes under torchrun `pid` (the ranks), and `pid` itself where `agent`
    (the warm agent, `launch.warm`, registers too), for their stacks (STACKS_SIGNAL,
    `dump_on_signal`), one after another, each given its share of `wait_s` to write them
    before the next is asked (they share the job's log: dumps written at once interleave
    line by line) and the job is killed. A process that registered no handler ends on it:
    only the ones about to be killed are asked."""
    try:
        top = psutil.Process(pid)
        children = top.children(recursive=True)
    except psutil.NoSuchProcess:
        return
    asked = [top, *children] if agent else children
    for p in asked:
        try:
            p.send_signal(STACKS_SIGNAL)
        except psutil.NoSuchProcess:
            continue
        time.sleep(wait_s / max(len(asked), 1))


def kill_job(pid: int) -> None:
    """SIGKILL torchrun and its workers (in sessions of their own: not its process group).
    torchrun is stopped first, so that it starts no worker after they are listed."""
    try:
        psutil.Process(pid).suspend()
    except psutil.NoSuchProcess:
        return
    for p in job_pids(pid):
        _kill(p)


def _kill(pid: int) -> None:
    try:
        psutil.Process(pid).kill()
    except psutil.NoSuchProcess:
        pass
