"""A session's warm workers (`elastic.warm`, kept by `launch.pool.WarmPool`): one a queue
session opens (`session_pool`) for every elastic job it launches on this host, which
outlives each of them. A job launched while it is open takes every rank's process from it,
its first ranks as well as those that join (`ElasticJob`), and the pool starts a new one
behind each it gives out, one at a time, so the next job, or the next worker a running job
takes in place, finds one waiting. A job's own warm workers, for its joiners
(`faults.warm_workers`, `join_at`, `replace`), are a pool of the same kind, its own.
"""

from __future__ import annotations

import sys

from hetflow.training.launch.pool import Kept

COMMAND = [sys.executable, "-m", "hetflow.training.elastic.warm"]

_kept = Kept(COMMAND)
session_pool = _kept.open  # (size): every job launched under `on_loss: continue` meanwhile
current = _kept.current
