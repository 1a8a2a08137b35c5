"""Every `>>>` example in the installed package runs, so a docstring's example cannot go stale."""

from __future__ import annotations

import doctest
import importlib
import pkgutil
from pathlib import Path

import pytest

import hetflow

LAYERS = ("forecast", "flows", "tasks", "training", "infra", "emulation")


def module_names() -> list[str]:
    """Every module of the hetflow namespace: hetflow's own folder, then each layer's tree."""
    names = [
        f"hetflow.{m.name}" for m in pkgutil.iter_modules([str(Path(hetflow.__file__).parent)])
    ]
    for layer in LAYERS:
        package = importlib.import_module(f"hetflow.{layer}")
        names += [m.name for m in pkgutil.walk_packages(package.__path__, f"hetflow.{layer}.")]
    return sorted(set(names))


def with_examples() -> list[str]:
    finder = doctest.DocTestFinder()
    out = []
    for name in module_names():
        module = importlib.import_module(name)
        if any(t.examples for t in finder.find(module, name)):
            out.append(name)
    return out


def test_the_namespace_is_walked_whole():
    names = module_names()
    assert "hetflow.records" in names and "hetflow.training.worker" in names
    assert "hetflow.forecast.rent.spot" in names  # a room under hetflow/ is walked too
    assert not any(n.startswith(("hetflow.benchmarks", "hetflow.tests")) for n in names)


@pytest.mark.parametrize("name", with_examples())
def test_docstring_examples_run(name):
    result = doctest.testmod(importlib.import_module(name), verbose=False)
    assert result.failed == 0, f"{result.failed} of {result.attempted} examples failed in {name}"
