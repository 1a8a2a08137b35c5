"""Emulating a heterogeneous worker on a shared CPU host: compute dilation and link delay."""

from __future__ import annotations

import time

from training.comm import Link
from training.job import RunSpec

now = time.perf_counter


class Emulator:
    """Time dilation for an emulated worker: a compute phase lasts `slowdown` x its CPU time.

    CPU time of the computing thread, not wall time: on a shared host the ranks wait for a
    core, and that wait (which depends on what the other ranks do) must not leak into the
    emulated device's speed. The phase is padded with sleep up to slowdown x CPU seconds.
    """

    def __init__(self, slowdown: float, link: Link) -> None:
        self.slowdown = slowdown
        self.link = link
        self._wall = self._cpu = 0.0
        self._open = False
        self.computed_at = self.finished_at = 0.0  # when the last phase's own work / its pad ended

    def start(self) -> None:
        self._wall, self._cpu = now(), time.thread_time()
        self._open = True

    def finish(self) -> float:
        """End the phase begun by `start` (pad it); a second call before the next `start` is a
        no-op. Returns when the phase ended, pad included."""
        if self._open:
            self.computed_at = now()
            target = self.slowdown * (time.thread_time() - self._cpu)
            pad = target - (self.computed_at - self._wall)
            if pad > 0:
                time.sleep(pad)
            self.finished_at = now()
            self._open = False
        return self.finished_at

    def dilating_hook(self, hook):
        """A DDP comm hook that first ends the compute phase when the last bucket is ready:
        backward's compute is over there, and its collectives have not yet all been issued."""

        def wrapped(state, bucket):
            if bucket.is_last():
                self.finish()
            return hook(state, bucket)

        return wrapped


def emulator_for(spec: RunSpec, rank: int) -> Emulator:
    if not spec.cluster.emulate:
        return Emulator(1.0, Link(None, 0.0))
    w = spec.cluster.workers[rank]
    return Emulator(spec.cluster.slowdowns()[rank], Link(w.link_gbps, w.link_latency_ms / 1e3))
