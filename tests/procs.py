"""Finding the processes of a job by their command line (psutil), for the tests that kill them."""

from __future__ import annotations

import psutil


def pids_with(*needles: str, excluding: str | None = None) -> list[int]:
    """Sorted PIDs whose command line contains every needle and, if given, not `excluding`."""
    pids = []
    for proc in psutil.process_iter(["pid", "cmdline"]):
        cmd = " ".join(proc.info["cmdline"] or ())
        if all(n in cmd for n in needles) and (excluding is None or excluding not in cmd):
            pids.append(proc.info["pid"])
    return sorted(pids)
