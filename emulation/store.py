"""An emulated object store: what caching and prefetch save shows on loopback."""

from __future__ import annotations

import threading
import time


class EmulatedStore:
    """Delays a transfer as a slow object store would: latency per request, shared bandwidth.

    Requests overlap their latency (as concurrent GETs do); their bytes queue on one link of
    `mbps` megabits/s for this process. Both 0/None: no delay.
    """

    def __init__(self, latency_s: float = 0.0, mbps: float | None = None) -> None:
        if latency_s < 0 or (mbps is not None and mbps <= 0):
            raise ValueError(
                f"emulated S3: latency must be >= 0 and mbps > 0 (got {latency_s}, {mbps})"
            )
        self.latency_s = latency_s
        self.mbps = mbps
        self._free_at = 0.0
        self._lock = threading.Lock()

    @property
    def active(self) -> bool:
        return bool(self.latency_s or self.mbps)

    def delay(self, nbytes: int, started: float) -> None:
        ready = started + self.latency_s
        if self.mbps:
            with self._lock:
                begin = max(ready, self._free_at)
                self._free_at = begin + nbytes * 8 / (self.mbps * 1e6)
                ready = self._free_at
        pause = ready - time.perf_counter()
        if pause > 0:
            time.sleep(pause)
