"""Emulating a heterogeneous worker on a shared CPU host: compute dilation and link delay."""

from __future__ import annotations

import time
from collections.abc import Sequence

from hetflow.emulation.costs import LocalCosts, SharedCosts
from hetflow.emulation.device_model import (
    PAUSE_FACTOR,
    Noise,
    StepNoise,
    Straggler,
    straggler_factor,
)
from hetflow.emulation.link import Link

now = time.perf_counter
__all__ = ["PAUSE_FACTOR", "Emulator", "now"]


def _flat(batch: int) -> float:
    return 1.0


class Emulator:
    """Time dilation for an emulated worker: a compute phase lasts `slowdown` x its CPU time.

    CPU time of the computing thread, not wall time: on a shared host the ranks wait for a
    core, and that wait (which depends on what the other ranks do) must not leak into the
    emulated device's speed. `finish` pads the phase with sleep up to `dilated(...)` seconds.

    A phase started with a `key` (training and the compute probe pass the batch size) is
    dilated from the least CPU time of that key's last `SMOOTH_PHASES` phases, its own
    included. The host's step-to-step CPU noise would otherwise be multiplied by the slowdown,
    making the emulated device noisy as well as slow, where a real accelerator repeats a step's
    time within a few percent; interference only ever adds time, so the least recent time is
    the estimate nearest the work itself (figures: docs/measurements/emulation.md). A lasting
    rise of the host's cost shows after `SMOOTH_PHASES` phases; a straggler's factor changes
    `slowdown` itself. `shape(key)` (a worker's own curve: `hetflow.emulation.presets`)
    multiplies a keyed phase's time, so a worker is not the host's curve times a scalar. With
    `costs` (a `SharedCosts` of the job's ranks on this host) the key's recent CPU times
    are every rank's, not this process's alone: workers differ by
    their slowdown, not by the noise of the process that emulates them. Noise on purpose is
    `noise` (`hetflow.emulation.device_model.StepNoise`, drawn from `seed`; without it, `jitter`
    and `pauses` drawn afresh each phase): each keyed phase lasts a log-normal factor (mean 1,
    its coefficient of variation) longer or shorter, part of it lasting several phases at
    the `shared` level, and now and then PAUSE_FACTOR times longer (a host's hiccup). The
    process moves one step per keyed phase: a step run as micro-batches moves it once each.

    A share run as micro-batches (`train.accumulate`) is one keyed phase per micro-batch, keyed
    by its size: a real device runs each as a pass of its own, paying its fixed cost each
    time, and DDP's comm hook, which ends a phase, runs on the last one's backward alone.

    On a GPU (`sync` given: a function that waits for the device's queued work) a phase is its
    wall time from the device idle at `start` to the device idle at `finish`: the thread's CPU
    time there is the launches', not the work's. Emulated ranks sharing one GPU wait for it as
    they wait for a core.
    """

    def __init__(
        self,
        slowdown: float,
        link: Link,
        jitter: float = 0.0,
        seed: int = 0,
        sync=None,
        costs: SharedCosts | None = None,
        shape=None,
        pauses: float = 0.0,
        noise: Noise | None = None,
        stragglers: Sequence[Straggler] = (),
        rank: int = 0,
    ) -> None:
        self.slowdown = self.base_slowdown = slowdown
        self.stragglers, self.rank = list(stragglers), rank
        self.shape = shape if shape is not None else _flat
        self.sync = sync
        # each key's recent phases: shared by the job's ranks, or kept here (a GPU's phase is
        # its own wall time: nothing shared)
        self._costs = costs if costs is not None and sync is None else LocalCosts()
        self.link = link
        self._wall = self._cpu = 0.0
        self._open = False
        self._key: object = None
        self.noise = StepNoise(noise or Noise(cv=jitter, pauses=pauses), seed)
        self.computed_at = self.finished_at = 0.0  # when the last phase's own work / its pad ended

    @property
    def costs(self) -> SharedCosts | None:
        """The job's shared table this emulator dilates from; None where it keeps its own."""
        return self._costs if isinstance(self._costs, SharedCosts) else None

    def _clock(self) -> float:
        if self.sync is None:
            return time.thread_time()
        self.sync()
        return now()

    def start(self, key: object = None) -> None:
        self._cpu = self._clock()
        self._wall = now()
        self._key = key
        self._open = True

    def at_step(self, step: int) -> None:
        """The run is at `step`: `slowdown` is the device's times the factor of this rank's
        emulated stragglers there (`device_model.straggler_factor`: their onsets and ramps)."""
        self.slowdown = self.base_slowdown * straggler_factor(self.stragglers, self.rank, step)

    def forget(self) -> None:
        """Drop every key's recent CPU times: the next phases are dilated from their own alone
        (a compression trial's timed steps, after dense warm-up steps that cost less)."""
        self._costs.forget()

    def dilated(self, cpu: float, key: object = None) -> float:
        """Seconds a phase of `cpu` CPU seconds here lasts on the emulated device; a keyed
        phase's CPU time joins its key's recent ones. `finish` pads the phase to this."""
        if key is None:
            return self.slowdown * cpu
        return self._factor(key) * self._costs.add(key, cpu) * self.noise.next()

    def _factor(self, key: object) -> float:
        """The dilation of a phase of `key` before noise: `slowdown` x the worker's shape."""
        return self.slowdown * (self.shape(key) if isinstance(key, int) else 1.0)

    def finish(self) -> float:
        """End the phase begun by `start` (pad it); a second call before the next `start` is a
        no-op. Returns when the phase ended, pad included."""
        if self._open:
            spent = self._clock() - self._cpu
            self.computed_at = now()
            # a phase of no samples (a worker left out of the step, key 0) is no device work
            pad = 0.0 if self._key == 0 else self.dilated(spent, self._key)
            pad -= self.computed_at - self._wall
            if pad > 0:
                time.sleep(pad)
            self.finished_at = now()
            self._open = False
        return self.finished_at

    def catch_up(self) -> None:
        """Inside an open phase, pad until the emulated device would have reached the work done
        so far: `slowdown` x its CPU time, no more than the key's settled phase (the least of its
        recent ones, see `dilated`). DDP issues a bucket's collective here, so the emulated link
        starts carrying it when the emulated device, not the host, has its gradients."""
        if not self._open or self.sync is not None or self.slowdown <= 1 or self._key == 0:
            return
        spent = self._clock() - self._cpu
        settled = self._costs.settled(self._key)
        if settled is not None:
            spent = min(spent, settled)
        pad = self._factor(self._key) * spent - (now() - self._wall)
        if pad > 0:
            time.sleep(pad)

    def dilating_hook(self, hook):
        """A DDP comm hook that lets each bucket's collective go when the emulated device has
        computed its gradients (`catch_up`), and ends the compute phase at the last bucket:
        backward's compute is over there, and its collectives have not yet all been issued."""

        def wrapped(state, bucket):
            if bucket.is_last():
                self.finish()
            else:
                self.catch_up()
            return hook(state, bucket)

        return wrapped
