"""`benchmarks/` loaded from the source checkout, for `hetflow bench` and `hetflow simulate
--calibrate` (neither command imports the other for it)."""

from __future__ import annotations

import sys
from pathlib import Path

from hetflow.config import ConfigError


def benchmark_module(name: str):
    """`benchmarks.NAME` from the source checkout this package is installed from.

    benchmarks/ is not installed (it is measurement, not product): an editable install from a
    clone finds it beside `hetflow/`, without any edit of `sys.path`.
    """
    import importlib
    import importlib.util

    if "benchmarks" not in sys.modules:
        root = Path(__file__).resolve().parents[2] / "benchmarks"
        if not (root / "__init__.py").exists():
            raise ConfigError(
                "hetflow bench: benchmarks/ ships with the source checkout; "
                "install a clone with `pip install -e .` to run them"
            )
        spec = importlib.util.spec_from_file_location(
            "benchmarks", root / "__init__.py", submodule_search_locations=[str(root)]
        )
        package = importlib.util.module_from_spec(spec)
        sys.modules["benchmarks"] = package
        spec.loader.exec_module(package)
    return importlib.import_module(f"benchmarks.{name}")
