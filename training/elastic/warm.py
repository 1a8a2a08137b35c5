"""A warm worker: a process started ahead of a rank, with the interpreter, torch and the
worker's modules imported (`launch.warm.preload`, what torchrun's warm agent preloads), that
waits on its standard input for the rank it is to be, then runs that rank's worker
(`training.worker.main`). A rank's start then costs its assignment, not the import (seconds
of CPU each on a small host). `pool.WarmPool` keeps them, a job's or a session's.

    python -m hetflow.training.elastic.warm

Its assignment (`launch.warm.assigned`): the job file, the environment variables to set (the
rank's: `RANK`, the store's address, `world.JOINING` where it joins a running job), and the
log its output goes to from then on.

A process, not a fork of the launcher: a fork would share the launcher's
threads' state and its signal handlers (the ranks forked from torchrun's warm agent must reset
SIGINT/SIGTERM first); a process of its own has the default ones, and the rank installs its
own (`departure.Departures`).
"""

from __future__ import annotations

import os
import time


def main() -> None:
    """Preload, wait for the assignment, run the rank's worker."""
    from hetflow.training.launch.warm import assigned, preload

    preload()
    given = assigned()
    os.environ["HETFLOW_ASSIGNED_AT"] = repr(time.time())  # the end of its warm wait
    from hetflow.training.worker import main as worker_main

    worker_main(["--job", given["job"]])


if __name__ == "__main__":
    main()
