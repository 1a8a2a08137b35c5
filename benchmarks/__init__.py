"""Benchmarks that compare variants in one invocation: `hetflow bench NAME`.

Their shared helpers live in the installed package (`hetflow simulate --calibrate` uses them
too); they are imported here so that the benchmarks read `from benchmarks import ...`. The
profile run they plan from is `hetflow.training.launch.measure_profile`.
"""

from __future__ import annotations

from hetflow.infra.workspace import digits_workspace
from hetflow.output import wide_console, write_json

__all__ = ["digits_workspace", "wide_console", "write_json"]
