"""Where hetflow keeps local state: one directory, `$HETFLOW_HOME` or `~/.hetflow`."""

from __future__ import annotations

import datetime as dt
import os
import uuid
from pathlib import Path


def home() -> Path:
    p = Path(os.environ.get("HETFLOW_HOME") or Path.home() / ".hetflow").expanduser().resolve()
    p.mkdir(parents=True, exist_ok=True)
    return p


def default_cache_dir() -> Path:
    return home() / "cache"


def runs_dir() -> Path:
    return home() / "runs"


def new_run_dir(label: str) -> Path:
    """A fresh directory for one run under `runs_dir()`, named by time, label and a random tag."""
    stamp = dt.datetime.now().strftime("%Y%m%d-%H%M%S")
    path = runs_dir() / f"{stamp}-{label}-{uuid.uuid4().hex[:6]}"
    path.mkdir(parents=True)
    return path
