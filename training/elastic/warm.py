"""A warm worker: a process started ahead of a join, with the interpreter, torch and the
worker's modules imported (`launch.warm.preload`, what torchrun's warm agent preloads), that
waits on its standard input for the rank it is to be, then runs that rank's worker
(`training.worker.main`) and joins the running job in place. A join then costs the state
transfer, not the import (seconds of CPU each on a small host).

    python -m hetflow.training.elastic.warm --job RUN_DIR/job.json

The launcher (`launch.ElasticJob`) keeps them and writes one line, the rank and the names of
the flags to set (`world.JOINING`), to the one it assigns; an empty line or a closed input
ends it unused. A process, not a fork of the launcher: a fork would share the launcher's
threads' state and its signal handlers (the ranks forked from torchrun's warm agent must reset
SIGINT/SIGTERM first); a process of its own has the default ones, and the rank installs its
own (`departure.Departures`).
"""

from __future__ import annotations

import os
import sys
import time


def main(argv: list[str] | None = None) -> None:
    """Preload, wait for the assignment, run the rank's worker."""
    from hetflow.training.launch.warm import preload

    args = sys.argv[1:] if argv is None else argv
    preload()
    line = sys.stdin.readline().split()
    if not line:
        os._exit(0)
    os.environ["RANK"] = os.environ["LOCAL_RANK"] = line[0]
    for name in line[1:]:  # flags the launcher sets (`world.JOINING`)
        os.environ[name] = "1"
    os.environ["HETFLOW_ASSIGNED_AT"] = repr(time.time())  # the end of its warm wait
    from hetflow.training.worker import main as worker_main

    worker_main(args)


if __name__ == "__main__":
    main()
