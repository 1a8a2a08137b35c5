"""Where hetflow keeps local state: one directory, `$HETFLOW_HOME` or `~/.hetflow`."""

from __future__ import annotations

import os
from pathlib import Path


def home() -> Path:
    p = Path(os.environ.get("HETFLOW_HOME") or Path.home() / ".hetflow").expanduser().resolve()
    p.mkdir(parents=True, exist_ok=True)
    return p


def default_cache_dir() -> Path:
    return home() / "cache"


def runs_dir() -> Path:
    return home() / "runs"
