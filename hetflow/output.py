"""What a command hands back besides its exit code: figures as a JSON file, tables on a console
wide enough for them. Shared by `hetflow simulate` and the benchmarks."""

from __future__ import annotations

import json
from pathlib import Path


def write_json(path: str | None, out: dict) -> None:
    """The command's figures as JSON at `path` (its folder made), if a path was given."""
    if not path:
        return
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    Path(path).write_text(json.dumps(out, indent=1, default=str))
    print(f"wrote {path}")


def wide_console(min_width: int):
    """A rich console at least `min_width` wide: logs and pipes report 80 columns otherwise."""
    from rich.console import Console

    return Console(width=max(Console().width, min_width))
