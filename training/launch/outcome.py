"""What every launcher hands back: the launched job's result and wall time, or an error.

Both launchers (`local`: torchrun on this host; `ray_train`: Ray Train) import this module and
neither imports the other; `run.run_workers` chooses between them.
"""

from __future__ import annotations

from pathlib import Path
from typing import NamedTuple

from hetflow.training.faults.records import RankFailure


class Launched(NamedTuple):
    """A finished job: `raw` is result.json as rank 0 wrote it, `wall_s` the seconds from the
    launch to the last rank's exit (a tuple, so `raw, wall = run_workers(spec)` reads it)."""

    raw: dict
    wall_s: float


class LaunchError(RuntimeError):
    """The job did not finish (the launcher exited non-zero, ran past its deadline, or its
    workers could not be placed); the message carries the tail of the workers' output."""


class RankFailed(LaunchError):
    """A rank raised (or met a NaN/Inf gradient): the job was ended at once, not restarted.
    `failure` is that rank's record; the message names the rank, step and exception."""

    def __init__(self, failure: RankFailure, log: Path) -> None:
        super().__init__(f"{failure.summary()}\n(the job was stopped; log: {log})")
        self.failure = failure
