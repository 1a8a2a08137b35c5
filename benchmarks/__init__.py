"""Benchmarks that compare variants in one invocation: `hetflow bench NAME`, `hetflow simulate`."""

from __future__ import annotations

import json
from pathlib import Path


def write_json(path: str | None, out: dict) -> None:
    """The benchmark's figures as JSON at `path` (its folder made), if a path was given."""
    if not path:
        return
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    Path(path).write_text(json.dumps(out, indent=1, default=str))
    print(f"wrote {path}")
