"""Repeated comparisons, fairly (pure): which variant runs first in each round, and each
reported figure's own median over the rounds, with its spread.

Round r runs the variants rotated left by r, so that over as many rounds as there are
variants each runs first once, and a launch that warms the host (the page cache, imports,
compiled kernels) falls on each in turn rather than always helping the second. The demo and
the compare flow, which run once, take the round from the seed (`--seed 1` runs the optimized
variant first). A figure reported over rounds is the median of that figure (the mean of the
middle two for an even count), never another figure's run, with its min-max beside it.

    >>> run_order(["baseline", "static", "dynamic"], 1)
    ['static', 'dynamic', 'baseline']
    >>> median_spread([3.0, None, 1.0, 2.0])
    (2.0, [1.0, 3.0])
"""

from __future__ import annotations

import statistics
from collections.abc import Iterable, Sequence


def run_order(names: Sequence[str], round_: int) -> list[str]:
    """The order round `round_` runs `names` in: `names` rotated left by `round_` (mod their
    count); round 0 runs them as given."""
    if not names:
        return []
    k = round_ % len(names)
    return [*names[k:], *names[:k]]


def median_spread(values: Iterable[float | None]) -> tuple[float | None, list[float] | None]:
    """(median, [min, max]) of the values that were measured (None left out: a run that never
    reached a target has no time to it); (None, None) where none was."""
    got = [v for v in values if v is not None]
    if not got:
        return None, None
    return statistics.median(got), [min(got), max(got)]


def with_medians(row: dict, runs: list[dict], figures: Iterable[str]) -> dict:
    """`row` with each of `figures` that some run has replaced by its median over `runs`, and
    `FIGURE_range` ([min, max]) beside it; `row` itself is left as it was."""
    out = dict(row)
    for name in figures:
        if not any(name in r for r in runs):
            continue
        out[name], out[f"{name}_range"] = median_spread(r.get(name) for r in runs)
    return out
