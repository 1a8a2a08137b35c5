"""An emulated network link."""

from __future__ import annotations

import time
from dataclasses import dataclass


@dataclass
class Link:
    """An emulated network link: each window of traffic costs bytes / bandwidth + latency."""

    gbps: float | None
    latency_s: float = 0.0

    def delay(self, nbytes: float, collectives: int) -> float:
        if self.gbps is None and not self.latency_s:
            return 0.0
        seconds = collectives * self.latency_s
        if self.gbps:
            seconds += nbytes * 8 / (self.gbps * 1e9)
        if seconds > 0:
            time.sleep(seconds)
        return seconds
