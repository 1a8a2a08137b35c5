"""Warm workers (`elastic.warm`): processes with the interpreter, torch and the worker's
modules imported, each waiting for the rank it is to be. A pool is either a job's own
(`ElasticJob`'s, for the workers that join it: `faults.warm_workers`, `join_at`,
`replace`) or a session's (`session_pool`): one a queue session opens for every job it
launches on this host, which outlives each of them. A job launched while a session's pool is
open takes every rank's process from it, its first ranks as well as those that join, and the
pool starts a new one behind each it gives out, so the next job, or the next worker a running
job takes in place, finds one waiting.

A process serves one rank and ends with it: the pool outlives the jobs, its processes do not.
A rank's process carries its job's process group, threads, signal handlers and cgroup; a
fresh one per rank keeps one job's state out of the next. What a rank's process costs on
taking it is its assignment line, not a Python and torch start.

Not torchrun's: its agent forks a job's ranks itself, for one job (`launch.warm` makes that
agent warm); a pool that outlives jobs has no such agent in this launcher. Ray keeps its own
(its workers' processes are reused across tasks); this pool serves the local launcher.
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

from hetflow.training.faults.watch import _kill

COMMAND = [sys.executable, "-m", "hetflow.training.elastic.warm"]


def assignment(job: Path, env: dict[str, str], log: Path | None) -> bytes:
    """The line a warm worker reads (`warm.main`): the job file, the environment variables it
    sets (those that differ from its own, started with the pool's), the log it writes to."""
    return (json.dumps({"job": str(job), "env": env, "log": str(log or "")}) + "\n").encode()


class WarmPool:
    """Keeps `size` warm workers waiting, started with `env` (default: this process's), their
    output to `log` until assigned (default: discarded). `take` assigns one and, where
    `refill`, starts another behind it (else `fill` does, when asked); `close` ends those
    still waiting. Safe to use from several threads."""

    def __init__(self, size: int, env: dict[str, str] | None = None, log=None, refill=True):
        self.size, self.env, self.log, self.refill = size, env, log, refill
        self.waiting: list[subprocess.Popen] = []
        self.given = 0
        self.lock = threading.Lock()
        self.closed = False

    def fill(self) -> None:
        """Start warm workers until `size` wait (ended ones dropped)."""
        out = self.log if self.log is not None else subprocess.DEVNULL
        with self.lock:
            self.waiting = [p for p in self.waiting if p.poll() is None]
            while not self.closed and len(self.waiting) < self.size:
                self.waiting.append(
                    subprocess.Popen(
                        COMMAND,
                        stdin=subprocess.PIPE,
                        stdout=out,
                        stderr=subprocess.STDOUT,
                        env=self.env,
                    )
                )

    def take(self, job: Path, env: dict[str, str], log: Path | None) -> subprocess.Popen | None:
        """A waiting worker, assigned the rank `env` names of the job in `job` (its output to
        `log`), one started behind it; None where none waits (the caller starts one cold)."""
        with self.lock:
            live = [p for p in self.waiting if p.poll() is None]
            proc = live.pop(0) if live else None
            self.waiting = live
            if proc is not None:
                self.given += 1
                try:
                    proc.stdin.write(assignment(job, self._diff(env), log))
                    proc.stdin.close()
                except BrokenPipeError:  # it ended between the poll and the write
                    proc = None
        if self.refill:
            self.fill()
        return proc

    def _diff(self, env: dict[str, str]) -> dict[str, str]:
        mine = self.env if self.env is not None else os.environ
        return {k: v for k, v in env.items() if mine.get(k) != v}

    def close(self) -> None:
        """End the workers still waiting (killed: one may still be importing, and none holds
        anything of a job's)."""
        with self.lock:
            self.closed, waiting, self.waiting = True, self.waiting, []
        for p in waiting:
            _kill(p.pid)
            p.wait()
            with contextlib.suppress(OSError):
                p.stdin.close()

    def __enter__(self) -> WarmPool:
        self.fill()
        return self

    def __exit__(self, *exc) -> None:
        self.close()


_session: WarmPool | None = None


@contextlib.contextmanager
def session_pool(size: int) -> Iterator[WarmPool]:
    """A pool of `size` warm workers that every job this process launches under
    `on_loss: continue` meanwhile takes its ranks' processes from (`current`); ended, with
    the workers still waiting, on leaving. One at a time in a process."""
    global _session
    if _session is not None:
        raise RuntimeError("a session's warm pool is already open in this process")
    with WarmPool(size) as pool:
        _session = pool
        try:
            yield pool
        finally:
            _session = None


def current() -> WarmPool | None:
    """The session's pool open in this process, if any."""
    return _session
