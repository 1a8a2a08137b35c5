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

from hetflow.training.launch.pool import WarmPool

COMMAND = [sys.executable, "-m", "hetflow.training.launch.warm", "--wait"]

_agents: WarmPool | None = None


@contextlib.contextmanager
def agent_pool(launches: int | None, size: int = 1) -> Iterator[WarmPool | None]:
    """`size` warm agents kept for the jobs this process launches under torchrun meanwhile
    (`current`), at most `launches` started in all (None: no bound; `WarmPool.expect` lowers
    it); none where one is open already (the outer one serves), `launches` is 0, or warm
    ranks are off (`HETFLOW_WARM_RANKS=0`, `run.WARM_RANKS`)."""
    global _agents
    if _agents is not None or launches == 0 or os.environ.get("HETFLOW_WARM_RANKS") == "0":
        yield None
        return
    with WarmPool(size, COMMAND, together=1) as pool:
        if launches is not None:
            pool.expect(launches)
        _agents = pool
        try:
            yield pool
        finally:
            _agents = None


def current() -> WarmPool | None:
    """The agents' pool open in this process, if any."""
    return _agents
