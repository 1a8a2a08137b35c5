"""torchrun's warm agents kept between jobs (`launch.warm --wait`, kept by
`launch.pool.WarmPool`): while `agent_pool` is open, a job `local.run_torchrun` launches warm
takes an agent that has already imported what its ranks run, instead of starting one that
imports it then. A flow that runs several jobs in turn on this host (`flows.compare`: the
profile, then each variant) opens one: the next job's agent imports while the job before it
trains, one at a time, and the launch costs its assignment, not the agent's imports.
"""

from __future__ import annotations

import contextlib
import os
import sys
from collections.abc import Iterator

from hetflow.training.launch.pool import Kept, WarmPool

COMMAND = [sys.executable, "-m", "hetflow.training.launch.warm", "--wait"]

# torchrun's ranks forked from a warm agent (`launch.warm`) where every rank is on the CPU;
# HETFLOW_WARM_RANKS=0: a fresh interpreter per rank (`benchmarks.launch --cold`), and no
# agent kept. On a host loaded far past its cores a niced agent's imports, in one process,
# get less CPU than four ranks' (docs/measurements/demo.md).
WARM_RANKS = os.environ.get("HETFLOW_WARM_RANKS", "1") != "0"

_kept = Kept(COMMAND)
current = _kept.current


@contextlib.contextmanager
def agent_pool(launches: int | None, size: int = 1) -> Iterator[WarmPool | None]:
    """`size` warm agents kept for the jobs this process launches under torchrun meanwhile
    (`current`), at most `launches` started in all (`Kept.open`); none where warm ranks are
    off (`WARM_RANKS`)."""
    with _kept.open(size, launches if WARM_RANKS else 0) as pool:
        yield pool
