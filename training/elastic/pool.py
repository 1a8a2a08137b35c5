"""A session's warm workers (`elastic.warm`, kept by `launch.pool.WarmPool`): one a queue
session opens (`session_pool`) for every elastic job it launches on this host, which
outlives each of them. A job launched while it is open takes every rank's process from it,
its first ranks as well as those that join (`ElasticJob`), and the pool starts a new one
behind each it gives out, one at a time, so the next job, or the next worker a running job
takes in place, finds one waiting. A job's own warm workers, for its joiners
(`faults.warm_workers`, `join_at`, `replace`), are a pool of the same kind, its own.
"""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Iterator

from hetflow.training.launch.pool import WarmPool

COMMAND = [sys.executable, "-m", "hetflow.training.elastic.warm"]

_session: WarmPool | None = None


@contextlib.contextmanager
def session_pool(size: int) -> Iterator[WarmPool]:
    """A pool of `size` warm workers that every job this process launches under
    `on_loss: continue` meanwhile takes its ranks' processes from (`current`), importing one
    at a time; ended, with the workers still waiting, on leaving. One at a time in a
    process."""
    global _session
    if _session is not None:
        raise RuntimeError("a session's warm pool is already open in this process")
    with WarmPool(size, COMMAND, together=1) as pool:
        _session = pool
        try:
            yield pool
        finally:
            _session = None


def current() -> WarmPool | None:
    """The session's pool open in this process, if any."""
    return _session
