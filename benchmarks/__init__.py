"""Benchmarks that compare variants in one invocation: `hetflow bench NAME`.

Their shared helpers live in the installed package (`hetflow simulate --calibrate` uses them
too); they are imported here so that the benchmarks read `from benchmarks import ...`. The
profile run they plan from is `hetflow.training.launch.measure_profile`.
"""

from __future__ import annotations

from hetflow.config import TrainConfig
from hetflow.infra.workspace import digits_workspace
from hetflow.output import wide_console, write_json

__all__ = ["check_bench_recipe", "digits_workspace", "wide_console", "write_json"]


def check_bench_recipe(train: TrainConfig) -> None:
    """The recipe imports and reads what the benchmark's dataset holds (digits, tabular: the
    benchmarks write no other dataset yet); a one-line ConfigError naming it otherwise."""
    from hetflow.training.recipes import DataInfo, check_fits, check_recipe

    check_fits(check_recipe(train), DataInfo(), "the benchmark's digits dataset")
