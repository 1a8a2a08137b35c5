"""Warm processes kept waiting for what to run: the interpreter, torch and what a rank
runs imported (`launch.warm.preload`), each waiting on its input for one line, its
assignment (`launch.warm.assigned`). Two kinds use it: the elastic launcher's warm workers,
each of which becomes one rank (`elastic.pool`), and torchrun's warm agents, each of which
launches one job's ranks (`launch.agents`).

A process serves one assignment and ends with it: a pool outlives the jobs it serves, its
processes do not. A rank's process (or an agent's, whose ranks are its forks) carries its
job's process group, threads, signal handlers and cgroup; a fresh one per assignment keeps
one job's state out of the next. What it costs on taking it is its assignment line, not a
Python and torch start.

Written here: neither torchrun nor Ray keeps processes warm across jobs on one host.
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import threading
from collections import Counter
from collections.abc import Iterator

from hetflow.training.faults.watch import _kill


class WarmPool:
    """Keeps `size` processes of `command` waiting, started with `env` (default: this
    process's), their errors to `log` until assigned (default: discarded), at most `together`
    of them importing at a time, those given out before they had imported counted (default:
    all; a pool that refills beside running jobs imports one at a time, so that its refills
    take at most one core from them). One is ready once it has imported (its `ready` line).
    `take` assigns one, a ready one first, and, where `refill`, has another started behind
    it (else `size` drops by one, until the caller calls `resize`);
    `expect` caps how many more are started; `close` ends those still waiting. Safe to use
    from several threads. One that ends before it is ready (a broken install) stops the
    refills: the caller then starts its processes cold."""

    def __init__(
        self,
        size: int,
        command: list[str],
        env: dict[str, str] | None = None,
        log=None,
        refill=True,
        together=0,
    ):
        self.size, self.command, self.log, self.refill = size, command, log, refill
        self.env = dict(os.environ if env is None else env)  # what every process starts with
        self.together = together or None
        self.waiting: list[subprocess.Popen] = []
        self.ready: set[int] = set()  # the pids of those that have imported
        self.importing: set[int] = set()  # started, not yet imported, taken or not
        self.given: Counter[str] = Counter()  # assigned, by the caller's tag
        self.lock = threading.Lock()
        self.changed = threading.Condition(self.lock)
        self.closed = self.broken = False
        self.filler: threading.Thread | None = None
        self.started, self.limit = 0, None  # processes started; at most `limit` (`expect`)

    def resize(self, size: int) -> None:
        """Keep `size` waiting from now on, and have them started."""
        with self.lock:
            self.size = size
        self.fill()

    def fill(self) -> None:
        """Have processes started until `size` wait (`together` importing at a time)."""
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
                    self.command,
                    stdin=subprocess.PIPE,
                    stdout=subprocess.PIPE,
                    stderr=out,
                    env=self.env,
                )
                self.waiting.append(proc)
                self.importing.add(proc.pid)
                self.started += 1
            threading.Thread(target=self._until_ready, args=(proc,), daemon=True).start()

    def _room(self) -> bool:
        self.waiting = [p for p in self.waiting if p.poll() is None]
        more = self.limit is None or self.started < self.limit
        together = self.together or self.size
        return more and len(self.waiting) < self.size and len(self.importing) < together

    def expect(self, assignments: int) -> None:
        """At most `assignments` more are coming: start no process beyond those (those
        waiting count), so none is started only to be ended unused."""
        with self.lock:
            self._room()
            self.limit = self.started + max(0, assignments - len(self.waiting))
            self.changed.notify_all()

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
            self.importing.discard(proc.pid)
            if ready:
                self.ready.add(proc.pid)
            elif ended and not self.closed:
                self.broken = proc.returncode not in (None, 0)
            self.changed.notify_all()

    def wait_ready(self, timeout_s: float) -> bool:
        """Wait until `size` waiting processes have imported, at most `timeout_s`; whether
        they have."""
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

    def take(self, fields: dict, env: dict[str, str], tag: str = "") -> subprocess.Popen | None:
        """A waiting process, a ready one first, given its assignment: `fields` (what it
        runs, and `log`, where its output goes from then on) and the environment `env` (sent
        as the variables that differ from those the pool started it with, and those to
        unset); counted in `given` under `tag`. None where none waits or the pool is broken
        (the caller starts one cold)."""
        unset = [k for k in self.env if k not in env]
        line = (json.dumps({**fields, "env": self._diff(env), "unset": unset}) + "\n").encode()
        with self.lock:
            self._room()  # the ended ones dropped
            self.waiting.sort(key=lambda p: p.pid not in self.ready)
            proc = self.waiting.pop(0) if self.waiting and not self.broken else None
            if proc is not None:
                try:
                    proc.stdin.write(line)
                    proc.stdin.close()
                    self.given[tag] += 1
                    if not self.refill:  # not replaced: one fewer kept, until `resize`
                        self.size -= 1
                except BrokenPipeError:  # it ended between the poll and the write
                    proc = None
        if self.refill:
            self.fill()
        return proc

    def _diff(self, env: dict[str, str]) -> dict[str, str]:
        return {k: v for k, v in env.items() if self.env.get(k) != v}

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


class Kept:
    """The one pool of `command` open in this process at a time (`open`, `current`): the
    launchers take from it whatever job they start meanwhile (`elastic.pool`'s warm
    workers, `launch.agents`' warm agents)."""

    def __init__(self, command: list[str]) -> None:
        self.command, self.pool = command, None

    @contextlib.contextmanager
    def open(self, size: int, launches: int | None = None) -> Iterator[WarmPool | None]:
        """`size` kept waiting, importing one at a time, at most `launches` started in all
        (None: no bound; `WarmPool.expect` lowers it), ended with those still waiting on
        leaving; None where one is open already (the outer one serves) or `launches` is 0."""
        if self.pool is not None or launches == 0:
            yield None
            return
        with WarmPool(size, self.command, together=1) as pool:
            if launches is not None:
                pool.expect(launches)
            self.pool = pool
            try:
                yield pool
            finally:
                self.pool = None

    def current(self) -> WarmPool | None:
        """The pool open in this process, if any."""
        return self.pool
