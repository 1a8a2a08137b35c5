"""The benchmarks as an installed package: `hetflow bench NAME` imports `benchmarks.NAME`
plainly, `python -m benchmarks.NAME` runs the same benchmark, and an install that left the
package out is one line."""

from __future__ import annotations

import importlib
import os
import subprocess
import sys
from pathlib import Path

import pytest

from hetflow.cli import main
from hetflow.cli.commands import BENCHMARKS, benchmark_module

ROOT = Path(__file__).resolve().parents[3]


def test_bench_imports_the_installed_package_by_its_name():
    assert benchmark_module("host") is importlib.import_module("benchmarks.host")
    assert set(BENCHMARKS) <= {p.stem for p in (ROOT / "benchmarks").iterdir()}


def test_an_install_without_the_benchmarks_is_one_line(monkeypatch, capsys):
    for name in [m for m in sys.modules if m == "benchmarks" or m.startswith("benchmarks.")]:
        monkeypatch.delitem(sys.modules, name)
    monkeypatch.setattr(sys, "meta_path", [_NoBenchmarks(), *sys.meta_path])
    assert main(["bench", "host", "--help"]) == 2
    err = capsys.readouterr().err
    assert "the package `benchmarks` is not installed" in err and len(err.splitlines()) == 1


class _NoBenchmarks:
    """An import finder under which `benchmarks` is not installed."""

    def find_spec(self, name, path=None, target=None):
        if name == "benchmarks":
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
        return None


@pytest.mark.parametrize("module", ["benchmarks.host", "benchmarks.hetero"])
def test_a_benchmark_runs_as_a_module(module):
    """A module (its main guard) and a package (its `__main__.py`): `--help` from their own
    parser, the same as `hetflow bench NAME --help`."""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    out = subprocess.run(
        [sys.executable, "-m", module, "--help"],
        capture_output=True,
        text=True,
        cwd=ROOT,
        env=env,
        timeout=120,
    )
    assert out.returncode == 0, out.stderr
    assert f"hetflow bench {module.split('.')[1]}" in out.stdout
