"""A warm worker: a process started ahead of a rank, with the interpreter, torch and the
worker's modules imported (`launch.warm.preload`, what torchrun's warm agent preloads), that
waits on its standard input for the rank it is to be, then runs that rank's worker
(`training.worker.main`). A rank's start then costs its assignment, not the import (seconds
of CPU each on a small host). `pool.WarmPool` keeps them, a job's or a session's.

    python -m hetflow.training.elastic.warm

Once imported it writes `ready` to its output (the pool's pipe). The assignment is one line
of JSON (`pool.assignment`): the job file, the environment variables to set (the rank's:
`RANK`, the store's address, `world.JOINING` where it joins a running job), and the log its
output goes to from then on; an empty line or a closed input ends it unused.

A process, not a fork of the launcher: a fork would share the launcher's
threads' state and its signal handlers (the ranks forked from torchrun's warm agent must reset
SIGINT/SIGTERM first); a process of its own has the default ones, and the rank installs its
own (`departure.Departures`).
"""

from __future__ import annotations

import json
import os
import sys
import time


def main() -> None:
    """Preload, wait for the assignment, run the rank's worker."""
    from hetflow.training.launch.warm import preload

    preload()
    print("ready", flush=True)  # to the pool (`pool.WarmPool`), which starts the next one
    line = sys.stdin.readline()
    if not line.strip():
        os._exit(0)
    given = json.loads(line)
    # the job's log, appended to as its launcher's own ranks do; the pool's pipe closed
    fd = os.open(given["log"], os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    for out in (1, 2):
        os.dup2(fd, out)
    os.close(fd)
    os.environ.update(given["env"])
    os.environ["HETFLOW_ASSIGNED_AT"] = repr(time.time())  # the end of its warm wait
    from hetflow.training.worker import main as worker_main

    worker_main(["--job", given["job"]])


if __name__ == "__main__":
    main()
