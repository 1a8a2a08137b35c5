"""An emulated network link: one rank's outgoing link, which carries one transfer at a time."""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field

import torch

now = time.perf_counter


@dataclass
class Link:
    """An emulated network link: a transfer of `nbytes` in `collectives` collectives costs
    `scale` x (bytes / bandwidth + collectives x latency), and transfers queue behind each
    other. `scale` is the cluster's time scale: compute runs that many times slower than the
    device it emulates, and so does the link, so that the share of the step spent
    communicating is the cluster's whatever the time scale.

    `delay` sleeps the cost at once (a probe timing one all-reduce). `deliver` emulates a
    collective issued asynchronously, as DDP issues each gradient bucket's during backward: the
    link carries it from when the real collective completed (every rank has joined it) or from
    when the link's previous transfer ends, whichever is later; the future it returns completes
    then, while the caller (backward) goes on. Written here: torch and gloo have no network
    emulation, and `tc netem` would need root and would slow every process on the host.
    """

    gbps: float | None
    latency_s: float = 0.0
    scale: float = 1.0
    free_at: float = field(default=0.0, repr=False)  # when the last queued transfer ends
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    @property
    def emulated(self) -> bool:
        return bool(self.gbps) or self.latency_s > 0

    def cost(self, nbytes: float, collectives: int) -> float:
        """Seconds the link takes to carry `nbytes` in `collectives` collectives."""
        if not self.emulated:
            return 0.0
        wire = nbytes * 8 / (self.gbps * 1e9) if self.gbps else 0.0
        return self.scale * (collectives * self.latency_s + wire)

    def delay(self, nbytes: float, collectives: int) -> float:
        """Sleep the cost of a transfer (not queued: nothing else is in flight); the seconds."""
        seconds = self.cost(nbytes, collectives)
        if seconds > 0:
            time.sleep(seconds)
        return seconds

    def occupy(self, nbytes: float, collectives: int) -> float:
        """Queue a transfer that may start now; the `now()` at which it has been carried."""
        with self._lock:
            self.free_at = max(now(), self.free_at) + self.cost(nbytes, collectives)
            return self.free_at

    def deliver(self, fut: torch.futures.Future, nbytes: float, collectives: int):
        """A future with `fut`'s value (or error), completed once `fut` has and the link has
        then carried the transfer (`occupy`), by a timer thread: the caller does not wait."""
        out: torch.futures.Future = torch.futures.Future()

        def finish(done: torch.futures.Future) -> None:
            try:
                value = done.value()
            except Exception as e:  # the collective's own failure, passed on as it is
                out.set_exception(e)
                return
            rest = self.occupy(nbytes, collectives) - now()
            if rest <= 0:
                out.set_result(value)
                return
            timer = threading.Timer(rest, out.set_result, args=(value,))
            timer.daemon = True
            timer.start()

        fut.add_done_callback(finish)
        return out
