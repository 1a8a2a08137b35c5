"""Benchmarks that compare variants in one invocation: `hetflow bench NAME`.

Their shared helpers live in the installed package (`hetflow simulate --calibrate` uses them
too); they are imported here so that the benchmarks read `from benchmarks import ...`. The
profile run they plan from is `hetflow.training.launch.run.measure_profile`.
"""

from __future__ import annotations

from hetflow.config import TrainConfig
from hetflow.infra.workspace import digits_workspace
from hetflow.output import wide_console, write_json

__all__ = ["check_bench_recipe", "digits_workspace", "wide_console", "write_json"]


BENCH_TEXT_MB = 4.0  # of the standard library's source, for token recipes (gpt)


def check_bench_recipe(train: TrainConfig) -> float | None:
    """The recipe imports and reads what a benchmark can write (digits, tabular; or the
    standard library's source, tokens); a one-line ConfigError naming it otherwise. Returns
    the MB of text to write for a token recipe (`digits_workspace`'s `text_mb`), else None."""
    from hetflow.training.recipes import DataInfo, check_fits, check_recipe

    recipe = check_recipe(train)
    if recipe.kind == "tokens":
        return BENCH_TEXT_MB
    check_fits(recipe, DataInfo(), "the benchmark's digits dataset")
    return None
