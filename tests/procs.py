"""Processes in tests: the CLI run as a user runs it, and finding a job's processes by their
command line (psutil), for the tests that kill them."""

from __future__ import annotations

import subprocess
import sys

import psutil


def run_cli(args: list[str], env: dict[str, str], timeout: float) -> subprocess.CompletedProcess:
    """`python -m hetflow.cli ARGS` in `env`, its output captured, whatever its exit status."""
    return subprocess.run(
        [sys.executable, "-m", "hetflow.cli", *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


def pids_with(*needles: str, excluding: str | None = None) -> list[int]:
    """Sorted PIDs whose command line contains every needle and, if given, not `excluding`."""
    pids = []
    for proc in psutil.process_iter(["pid", "cmdline"]):
        cmd = " ".join(proc.info["cmdline"] or ())
        if all(n in cmd for n in needles) and (excluding is None or excluding not in cmd):
            pids.append(proc.info["pid"])
    return sorted(pids)
