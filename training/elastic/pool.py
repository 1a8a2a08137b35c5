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
agent warm); a pool that outlives jobs has no such agent in this launcher. It serves the
local elastic launcher; under Ray, Ray's own worker processes run the ranks.
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

from hetflow.training.elastic.world import JOINING
from hetflow.training.faults.watch import _kill

COMMAND = [sys.executable, "-m", "hetflow.training.elastic.warm"]


def assignment(job: Path, env: dict[str, str], log: Path) -> bytes:
    """The line a warm worker reads (`warm.main`): the job file, the environment variables it
    sets (those that differ from its own, started with the pool's), the log it writes to."""
    return (json.dumps({"job": str(job), "env": env, "log": str(log)}) + "\n").encode()


class WarmPool:
    """Keeps `size` warm workers waiting, started with `env` (default: this process's), their
    errors to `log` until assigned (default: discarded), at most `together` of them importing
    at a time (default: all; a session's pool, which refills beside running jobs, imports
    one at a time, so that its refills take at most one core from them). A worker is ready
    once it has imported (its `ready` line). `take` assigns one, a ready one first, and,
    where `refill`, has another started behind it (else `fill` does, when asked); `close`
    ends those still waiting. Safe to use from several threads. A worker that ends before it
    is ready (a broken install) stops the refills: the launcher then starts its ranks cold."""

    def __init__(
        self, size: int, env: dict[str, str] | None = None, log=None, refill=True, together=0
    ):
        self.size, self.env, self.log, self.refill = size, env, log, refill
        self.together = together or None
        self.waiting: list[subprocess.Popen] = []
        self.ready: set[int] = set()  # the pids of those that have imported
        self.given = self.joins = 0  # workers assigned; of them, to join a running job
        self.lock = threading.Lock()
        self.changed = threading.Condition(self.lock)
        self.closed = self.broken = False
        self.filler: threading.Thread | None = None

    def fill(self) -> None:
        """Have warm workers started until `size` wait (`together` importing at a time)."""
        with self.lock:
            if self.filler is None and not self.closed:
                self.filler = threading.Thread(target=self._fill, name="warm-pool", daemon=True)
                self.filler.start()
            self.changed.notify_all()

    def _fill(self) -> None:
        out = self.log if self.log is not None else subprocess.DEVNULL
        while True:
            with self.lock:
                while not (self.closed or self.broken or self._room()):
                    self.changed.wait()
                if self.closed or self.broken:
                    return
                proc = subprocess.Popen(
                    COMMAND, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=out, env=self.env
                )
                self.waiting.append(proc)
            threading.Thread(target=self._until_ready, args=(proc,), daemon=True).start()

    def _room(self) -> bool:
        self.waiting = [p for p in self.waiting if p.poll() is None]
        importing = sum(p.pid not in self.ready for p in self.waiting)
        return len(self.waiting) < self.size and importing < (self.together or self.size)

    def _until_ready(self, proc: subprocess.Popen) -> None:
        """Mark `proc` ready at its `ready` line; where its output closes first and it was
        not taken meanwhile (its assignment closes it), it ended: the pool is broken."""
        ready = any(line.strip() == b"ready" for line in iter(proc.stdout.readline, b""))
        with self.lock:
            ended = not ready and proc in self.waiting
        if ended:
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=5)
        with self.lock:
            if ready:
                self.ready.add(proc.pid)
            elif ended and not self.closed:
                self.broken = proc.returncode not in (None, 0)
            self.changed.notify_all()

    def wait_ready(self, timeout_s: float) -> bool:
        """Wait until `size` warm workers have imported, at most `timeout_s`; whether they
        have."""
        with self.lock:
            return (
                self.changed.wait_for(
                    lambda: (
                        sum(p.pid in self.ready for p in self.waiting) >= self.size or self.broken
                    ),
                    timeout_s,
                )
                and not self.broken
            )

    def take(self, job: Path, env: dict[str, str], log: Path) -> subprocess.Popen | None:
        """A waiting worker, a ready one first, assigned the rank `env` names of the job in
        `job` (its output to `log`; `world.JOINING` in `env`: it joins a running job); None
        where none waits or the pool is broken (the caller starts one cold)."""
        with self.lock:
            self._room()  # the ended ones dropped
            self.waiting.sort(key=lambda p: p.pid not in self.ready)
            proc = self.waiting.pop(0) if self.waiting and not self.broken else None
            if proc is not None:
                self.given += 1
                self.joins += JOINING in env
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
        anything of a job's), and the refills."""
        with self.lock:
            self.closed, waiting, self.waiting = True, self.waiting, []
            self.changed.notify_all()
        for p in waiting:
            _kill(p.pid)
            p.wait()
            with contextlib.suppress(OSError):
                p.stdin.close()  # its output: read to its end by its watcher (`_until_ready`)
        if self.filler is not None:
            self.filler.join(timeout=10)

    def __enter__(self) -> WarmPool:
        self.fill()
        return self

    def __exit__(self, *exc) -> None:
        self.close()


_session: WarmPool | None = None


@contextlib.contextmanager
def session_pool(size: int) -> Iterator[WarmPool]:
    """A pool of `size` warm workers that every job this process launches under
    `on_loss: continue` meanwhile takes its ranks' processes from (`current`), importing one
    at a time; ended, with the workers still waiting, on leaving. One at a time in a
    process."""
    global _session
    if _session is not None:
        raise RuntimeError("a session's warm pool is already open in this process")
    with WarmPool(size, together=1) as pool:
        _session = pool
        try:
            yield pool
        finally:
            _session = None


def current() -> WarmPool | None:
    """The session's pool open in this process, if any."""
    return _session
