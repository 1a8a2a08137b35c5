"""torchrun with warm ranks: its elastic agent imports what a rank runs once, and forks each rank
from itself instead of starting a fresh interpreter per rank that imports it all again.

    python -m hetflow.training.launch.warm [torchrun's flags] hetflow.training.worker --job JOB
    python -m hetflow.training.launch.warm --wait     # the same, its flags read when assigned

takes torchrun's own flags (`torch.distributed.run`: rendezvous, restarts, the number of
processes) and runs the ranks under torchrun's own agent (`elastic_launch`), with its start
method `fork` and `worker.forked_main` as the entry: the rendezvous, the restarts after a
failure (forked again from the same warm agent) and the error files are torchrun's.

Why: a rank's imports are most of its start on a small host. Every DDP rank imports torch and
`torch._dynamo` (DDP's constructor and forward, and every optimizer step, import it: sympy and
torch's DTensor and FSDP stack come with it), the worker, the data layer and the S3 client:
seconds of CPU each, paid once per rank on cores the ranks share. Forked, they are paid once per
job, and the ranks share those pages.

Only where every rank computes on the CPU (`local.run_torchrun` decides): a CUDA driver that a
parent touched does not survive a fork, and torch's imports may touch it.
"""

from __future__ import annotations

import json
import os
import sys

from torch.distributed.elastic.multiprocessing.errors import record

# what a rank imports beyond the worker's own imports, each where installed
PRELOAD = ("torch._dynamo", "s3fs")


def preload(entry: str = "hetflow.training.worker") -> list[str]:
    """Import the worker, the entry module torchrun was named (a wrapper of the worker, as
    tests use, runs its own imports here) and `PRELOAD` into this process (the agent), so that
    the ranks forked from it find them imported; the modules imported, in order."""
    import importlib

    done = list(dict.fromkeys(["hetflow.training.worker", entry]))
    for name in done:
        importlib.import_module(name)
    for name in PRELOAD:
        try:
            importlib.import_module(name)
        except ImportError:  # s3fs: an install without the S3 extras reads file:// only
            continue
        done.append(name)
    return done


def assigned() -> dict:
    """This process's assignment, waited for (`launch.pool.WarmPool` keeps such processes):
    `ready` written to its output (the pool's pipe), then one line of JSON read from its
    input; an empty line or a closed input ends the process unused. Its output goes to the
    assignment's `log` from then on (appended to), its `env` is set and its `unset` unset
    (the launcher's environment now, not the pool's at its start); the assignment is
    returned (what to run: its other fields)."""
    print("ready", flush=True)
    line = sys.stdin.readline()
    if not line.strip():
        os._exit(0)
    given = json.loads(line)
    fd = os.open(given["log"], os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    for out in (1, 2):
        os.dup2(fd, out)
    os.close(fd)
    os.environ.update(given["env"])
    for name in given.get("unset", ()):
        os.environ.pop(name, None)
    return given


@record  # as torchrun's own main: a failed rank's error summary in the log
def main(argv: list[str] | None = None) -> None:
    """torchrun's `run` with the ranks forked from this process, warm (`preload`): its
    arguments are torchrun's, the training script's name then the worker's own flags; or
    `--wait` alone: preloaded, it waits for them (`assigned`: its `argv`), an agent kept
    warm between jobs (`launch.agents`)."""
    from torch.distributed.launcher.api import elastic_launch
    from torch.distributed.run import config_from_args, parse_args

    from hetflow.training.faults.watch import dump_on_signal

    dump_on_signal()  # inherited by the forks: a rank stuck before its own start says where
    argv = sys.argv[1:] if argv is None else argv
    if argv == ["--wait"]:
        preload()
        argv = assigned()["argv"]
    args = parse_args(argv)
    args.start_method = "fork"
    preload(args.training_script)
    from hetflow.training.worker import forked_main

    config, _, _ = config_from_args(args)
    elastic_launch(config=config, entrypoint=forked_main)(*args.training_script_args)


if __name__ == "__main__":
    main()
