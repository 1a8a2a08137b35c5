"""How noisy a real worker's step is: the level the emulator's noise defaults are taken from.

    hetflow bench noise [--ranks 2] [--steps 600] [--batch 32] [--recipe digits-cnn]

Runs real CPU workers (no emulation, each pinned to its own core) on an equal plan and reports,
per rank, from its sixth step on: the median compute time, the step-to-step coefficient of
variation (robust: 1.4826 x median absolute deviation / median, so that pauses do not inflate
it), the pauses: the share of steps longer than PAUSE_AT x the median, and their mean
length in medians, and how long a slow stretch lasts: the autocorrelation of the log step times
(pauses clipped to PAUSE_AT x the median) at lags LAGS, and the correlation time the lag-1 one
gives, -1 / ln(lag 1) steps (0 where the steps are independent). `ClusterSpec.noise`'s levels
are taken from what this reported (docs/measurements/emulation.md).
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys

from hetflow.cli.args import Parser, add_recipe_arg
from hetflow.config import BUILTIN_RECIPES, ClusterSpec, TrainConfig, WorkerSpec
from hetflow.infra.workspace import digits_workspace
from hetflow.records import Plan
from hetflow.training.launch.run import run_workers
from hetflow.training.launch.spec import RunSpec

PAUSE_AT = 2.0  # a step this many times the median is a pause
SKIP = 5  # the first steps build the model's kernels and caches
LAGS = (1, 2, 4, 8, 16, 32, 64)


def step_noise(compute_s: list[float]) -> dict:
    """The figures above for one rank's compute times (pure).

    >>> f = step_noise([1.0] * 5 + [1.0, 1.1, 0.9, 1.0, 3.0] * 4)
    >>> f["median_s"], f["pause_share"], f["pause_length"]
    (1.0, 0.2, 3.0)
    """
    xs = compute_s[SKIP:]
    med = statistics.median(xs)
    mad = statistics.median(abs(x - med) for x in xs)
    paused = [x / med for x in xs if x > PAUSE_AT * med]
    logs = [math.log(min(x, PAUSE_AT * med)) for x in xs]
    lag1 = _autocorrelation(logs, 1)
    return {
        "steps": len(xs),
        "median_s": round(med, 6),
        "cv": round(1.4826 * mad / med, 4),
        "pause_share": round(len(paused) / len(xs), 4),
        "pause_length": round(statistics.fmean(paused), 2) if paused else None,
        "autocorrelation": {k: round(_autocorrelation(logs, k), 3) for k in LAGS},
        "correlation_steps": round(-1 / math.log(lag1), 1) if 0 < lag1 < 1 else 0.0,
    }


def _autocorrelation(xs: list[float], lag: int) -> float:
    """The autocorrelation of `xs` at `lag` (0 for a constant series)."""
    mean = statistics.fmean(xs)
    var = sum((x - mean) ** 2 for x in xs)
    if var == 0:
        return 0.0
    return sum((a - mean) * (b - mean) for a, b in zip(xs[:-lag], xs[lag:], strict=True)) / var


def parser() -> argparse.ArgumentParser:
    p = Parser(prog="hetflow bench noise", description=__doc__.splitlines()[0])
    p.add_argument("--ranks", type=int, default=2, help="workers, one core each (default 2)")
    p.add_argument("--steps", type=int, default=600)
    p.add_argument("--batch", type=int, default=32, help="local batch of every worker")
    p.add_argument("--json", help="also write the figures to this file")
    add_recipe_arg(p, "digits-cnn", BUILTIN_RECIPES)
    return p


def main(argv: list[str] | None = None) -> int:
    a = parser().parse_args(argv)
    workers = [WorkerSpec(name=f"w{i}", cpus=1) for i in range(a.ranks)]
    with digits_workspace("noise") as (tmp, dataset):
        spec = RunSpec(
            run_name="noise",
            variant="real",
            cluster=ClusterSpec(name="noise", workers=workers, emulate=False),
            dataset=dataset,
            train=TrainConfig(
                recipe=a.recipe, global_batch=a.batch * a.ranks, steps=a.steps, eval_every=10**6
            ),
            plan=Plan.equal([a.batch] * a.ranks),
            run_dir=f"{tmp}/run",
        )
        result, _ = run_workers(spec)
    figures = [
        {"rank": r["rank"], **step_noise([rec["compute_s"] for rec in r["records"]])}
        for r in result["ranks"]
    ]
    for f in figures:
        print(
            f"rank {f['rank']}: median {f['median_s'] * 1e3:.2f} ms, cv {f['cv']:.3f}, "
            f"pauses {f['pause_share']:.3f} of steps (mean {f['pause_length']} x median), "
            f"autocorrelation at lags {f['autocorrelation']} (correlation "
            f"{f['correlation_steps']} steps) over {f['steps']} steps"
        )
    if a.json:
        with open(a.json, "w") as fh:
            json.dump({"recipe": a.recipe, "batch": a.batch, "ranks": figures}, fh, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
