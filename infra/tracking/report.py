"""The side-by-side table of two runs (pure): the same rows in the terminal, Prefect and MLflow.

A cell carries its metric's unit, read from the name (`unit`): counts as integers, bytes in
decimal units (1 MB = 10^6 bytes), seconds with `s`, fractions as percentages, rates in
samples/s, costs in dollars. The change column is relative (`+12.3%`), except for fractions,
whose change is the difference in percentage points (`+2.1 pp`): a share that moves from 0.3%
to 0.8% is `+0.5 pp`, not `+166%`.
"""

from __future__ import annotations

import math

HEADLINE = [
    "end_to_end_time_to_target_s",
    "end_to_end_s",
    "profiling_time_s",
    "startup_s",
    "trials_s",
    "eval_s",
    "checkpoint_s",
    "steady_samples_per_s",
    "throughput_samples_per_s",
    "train_loop_s",
    "time_to_target_s",
    "final_accuracy",
    "final_val_loss",
    "final_perplexity",
    "comm_bytes_total",
    "comm_bytes_per_step",
    "busy_fraction",
    "comm_fraction",
    "straggler_idle_fraction",
    "data_wait_fraction",
    "cost_usd",
    "cost_per_epoch_usd",
]
# the parent run's figures: each variant's, under `baseline/NAME` and `optimized/NAME`
PARENT_FIGURES = [k for k in HEADLINE if k != "comm_bytes_per_step"]
# the parent run's ratios, optimized over baseline: name -> the figure they divide
RATIOS = {
    "end_to_end_time_to_target_ratio": "end_to_end_time_to_target_s",
    "end_to_end_ratio": "end_to_end_s",
    "speedup": "throughput_samples_per_s",
    "time_to_target_ratio": "time_to_target_s",
    "comm_bytes_ratio": "comm_bytes_total",
    "cost_ratio": "cost_usd",
}
COUNTS = {"steps", "replans", "restarts", "steps_redone", "workers_left_out", "local_batch"}
FRACTIONS = {"final_accuracy", "test_accuracy", "cache_hit_ratio"}
LEGEND = (
    "change: relative to baseline; for percentages, the difference in percentage points (pp). "
    "1 MB = 10^6 bytes."
)


def table_metrics(metrics: dict[str, float]) -> list[str]:
    """Headline metrics, then per-rank busy fraction and local batch, in rank order."""
    ranks = sorted({int(k.split("/")[0][4:]) for k in metrics if k.startswith("rank")})
    per_rank = [f"rank{r}/{m}" for m in ("busy_fraction", "local_batch") for r in ranks]
    return [k for k in HEADLINE + per_rank if k in metrics]


def comparison(baseline: dict[str, float], optimized: dict[str, float]) -> dict:
    """{'baseline': {...}, 'optimized': {...}} restricted to the table's metrics."""
    keys = [k for k in table_metrics({**baseline, **optimized})]
    return {
        "baseline": {k: baseline.get(k) for k in keys},
        "optimized": {k: optimized.get(k) for k in keys},
    }


def unit(name: str) -> str:
    """The kind of a metric, from its name (a `rank{r}/` prefix ignored): 'count', 'bytes',
    'fraction', 'usd', 'rate', 'seconds', or '' for a plain number.

    >>> [unit(n) for n in ("rank2/local_batch", "comm_bytes_per_step", "data_wait_fraction")]
    ['count', 'bytes', 'fraction']
    >>> [unit(n) for n in ("rank0/samples_per_s", "train_loop_s", "cost_usd", "loss")]
    ['rate', 'seconds', 'usd', '']
    """
    base = name.rsplit("/", 1)[-1]
    if base in COUNTS:
        return "count"
    if "bytes" in base:
        return "bytes"
    if base.endswith("_fraction") or base in FRACTIONS:
        return "fraction"
    if base.endswith("_usd"):
        return "usd"
    if base.endswith("_per_s"):
        return "rate"
    if base.endswith("_s"):
        return "seconds"
    return ""


def change_pct(a: float | None, b: float | None) -> float | None:
    """b's change from a in percent; None where a is missing, zero or not finite."""
    if a is None or b is None or a == 0 or not math.isfinite(a):
        return None
    return (b - a) / abs(a) * 100


def fmt(v: float | None, name: str = "") -> str:
    """A cell in the unit of metric `name` (see `unit`); '-' if missing. With no name (or a
    unitless one): 3 decimals below 100, whole from 100, scientific from 1e6.

    >>> fmt(32.0, "rank0/local_batch"), fmt(726_300_000, "comm_bytes_total"), fmt(None)
    ('32', '726.3 MB', '-')
    >>> fmt(0.0123, "straggler_idle_fraction"), fmt(12.345, "train_loop_s")
    ('1.2%', '12.35 s')
    >>> fmt(1234.5, "throughput_samples_per_s"), fmt(0.01234, "cost_usd")
    ('1234 samples/s', '$0.0123')
    """
    if v is None:
        return "-"
    if not math.isfinite(v):
        return str(v)
    kind = unit(name)
    if kind == "count":
        return f"{round(v):d}"
    if kind == "bytes":
        return _bytes(v)
    if kind == "fraction":
        return f"{v * 100:.1f}%"
    if kind == "usd":
        return f"${v:.2f}" if abs(v) >= 1 else f"${v:.4f}"
    if kind == "rate":
        return f"{v:.0f} samples/s" if abs(v) >= 100 else f"{v:.1f} samples/s"
    if kind == "seconds":
        return f"{v:.3f} s" if abs(v) < 1 else f"{v:.2f} s" if abs(v) < 100 else f"{v:.0f} s"
    if abs(v) >= 1e6:
        return f"{v:.3e}"
    if abs(v) >= 100:
        return f"{v:.0f}"
    return f"{v:.3f}"


def _bytes(v: float) -> str:
    for size, suffix in ((1e12, "TB"), (1e9, "GB"), (1e6, "MB"), (1e3, "kB")):
        if abs(v) >= size:
            return f"{v / size:.1f} {suffix}"
    return f"{v:.0f} B"


def change(a: float | None, b: float | None, name: str = "") -> str:
    """The change column: percentage points for fractions, else relative percent; '-' where
    there is none.

    >>> change(0.003, 0.008, "data_wait_fraction"), change(100.0, 150.0, "train_loop_s")
    ('+0.5 pp', '+50.0%')
    """
    if unit(name) == "fraction":
        if a is None or b is None or not (math.isfinite(a) and math.isfinite(b)):
            return "-"
        return f"{(b - a) * 100:+.1f} pp"
    c = change_pct(a, b)
    return "-" if c is None else f"{c:+.1f}%"


def rows(table: dict) -> list[tuple[str, str, str, str]]:
    """(metric, baseline, optimized, change) as text, in the table's order."""
    out = []
    for k in table["baseline"]:
        a, b = table["baseline"][k], table["optimized"][k]
        out.append((k, fmt(a, k), fmt(b, k), change(a, b, k)))
    return out


def headline(baseline: dict[str, float], optimized: dict[str, float]) -> dict[str, float]:
    """The parent run's metrics: each variant's headline figures as `baseline/NAME` and
    `optimized/NAME`, and the ratios optimized / baseline (`speedup` of throughput,
    `time_to_target_ratio`, `comm_bytes_ratio`, `cost_ratio`) where both have the figure.

    >>> h = headline({"throughput_samples_per_s": 100.0}, {"throughput_samples_per_s": 250.0})
    >>> sorted(h.items())  # doctest: +NORMALIZE_WHITESPACE
    [('baseline/throughput_samples_per_s', 100.0), ('optimized/throughput_samples_per_s', 250.0),
     ('speedup', 2.5)]
    """
    out: dict[str, float] = {}
    for name in PARENT_FIGURES:
        for variant, metrics in (("baseline", baseline), ("optimized", optimized)):
            if metrics.get(name) is not None:
                out[f"{variant}/{name}"] = float(metrics[name])
    for ratio, name in RATIOS.items():
        a, b = baseline.get(name), optimized.get(name)
        if a and b is not None and math.isfinite(a) and math.isfinite(b):
            out[ratio] = b / a
    return out


def summary(figures: dict[str, float]) -> str:
    """One sentence from `headline`'s figures: the end-to-end time to the target (every cost
    counted), the speedup and the time-to-target ratio of the training steps.

    >>> summary({"speedup": 2.5, "time_to_target_ratio": 0.5})
    'optimized: 2.50x the baseline throughput; reaches the target accuracy in 0.50x the time.'
    >>> summary({"end_to_end_time_to_target_ratio": 0.8, "speedup": 2.5})[:60]
    'optimized: reaches the target in 0.80x the time from submit '
    """
    parts = []
    if "end_to_end_time_to_target_ratio" in figures:
        parts.append(
            f"reaches the target in {figures['end_to_end_time_to_target_ratio']:.2f}x the "
            "time from submit (profile, launch and trials included)"
        )
    if "speedup" in figures:
        parts.append(f"{figures['speedup']:.2f}x the baseline throughput")
    if "time_to_target_ratio" in figures:
        parts.append(
            f"reaches the target accuracy in {figures['time_to_target_ratio']:.2f}x the time"
        )
    return f"optimized: {'; '.join(parts)}." if parts else ""


def markdown(
    table: dict, title: str = "baseline vs optimized", before: str = "", after: str = ""
) -> str:
    """The table as markdown under `### title`, with `before` between title and table (a
    summary) and `after` below the legend (links)."""
    lines = [f"### {title}", ""]
    if before:
        lines += [before, ""]
    lines += ["| metric | baseline | optimized | change |", "|---|---:|---:|---:|"]
    lines += [f"| {m} | {a} | {b} | {c} |" for m, a, b, c in rows(table)]
    lines += ["", LEGEND]
    if after:
        lines += ["", after]
    return "\n".join(lines) + "\n"
