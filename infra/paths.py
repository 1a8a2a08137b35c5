"""Where hetflow keeps local state: one directory, `$HETFLOW_HOME` or `~/.hetflow`."""

from __future__ import annotations

import datetime as dt
import hashlib
import os
import uuid
from pathlib import Path

from filelock import FileLock


def home() -> Path:
    p = Path(os.environ.get("HETFLOW_HOME") or Path.home() / ".hetflow").expanduser().resolve()
    p.mkdir(parents=True, exist_ok=True)
    return p


def default_cache_dir() -> Path:
    return home() / "cache"


def runs_dir() -> Path:
    return home() / "runs"


def queue_dir() -> Path:
    """`home()/queue`: the inbox `hetflow queue submit` writes, the queue session's state."""
    path = home() / "queue"
    (path / "inbox").mkdir(parents=True, exist_ok=True)
    return path


def new_run_dir(label: str) -> Path:
    """A fresh directory for one run under `runs_dir()`, named by time, label and a random tag."""
    stamp = dt.datetime.now().strftime("%Y%m%d-%H%M%S")
    path = runs_dir() / f"{stamp}-{label}-{uuid.uuid4().hex[:6]}"
    path.mkdir(parents=True)
    return path


def host_lock(name: str, timeout_s: float = 600.0) -> FileLock:
    """An exclusive lock, shared by every process on this host with the same HETFLOW_HOME, on
    whatever `name` names (a dataset URL, ...): runs started at once take turns in the block.

    A lock file under `home()/locks`, named by a hash of `name` (so any string is safe as a
    name), as mosaicml/streaming guards its shared cache; left in place after use (removing a
    file another process may be about to lock is a race). `timeout_s` bounds the wait
    (filelock's Timeout). Runs on other hosts are not held back: that needs a lock in the
    object store itself.
    """
    folder = home() / "locks"
    folder.mkdir(exist_ok=True)
    digest = hashlib.sha256(name.encode()).hexdigest()[:24]
    return FileLock(folder / f"{digest}.lock", timeout=timeout_s)
