"""The side-by-side table of two runs (pure): the same rows in the terminal, Prefect and MLflow."""

from __future__ import annotations

import math

HEADLINE = [
    "throughput_samples_per_s",
    "train_loop_s",
    "time_to_target_s",
    "final_accuracy",
    "comm_bytes_total",
    "comm_bytes_per_step",
    "busy_fraction",
    "comm_fraction",
    "straggler_idle_fraction",
    "data_wait_fraction",
    "cost_usd",
    "cost_per_epoch_usd",
]


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


def change_pct(a: float | None, b: float | None) -> float | None:
    """b's change from a in percent; None where a is missing, zero or not finite."""
    if a is None or b is None or a == 0 or not math.isfinite(a):
        return None
    return (b - a) / abs(a) * 100


def fmt(v: float | None) -> str:
    """A cell: '-' if missing; 3 decimals below 100, whole from 100, scientific from 1e6."""
    if v is None:
        return "-"
    if abs(v) >= 1e6:
        return f"{v:.3e}"
    if abs(v) >= 100:
        return f"{v:.0f}"
    return f"{v:.3f}"


def rows(table: dict) -> list[tuple[str, str, str, str]]:
    """(metric, baseline, optimized, change) as text, in the table's order."""
    out = []
    for k in table["baseline"]:
        a, b = table["baseline"][k], table["optimized"][k]
        c = change_pct(a, b)
        out.append((k, fmt(a), fmt(b), "-" if c is None else f"{c:+.1f}%"))
    return out


def markdown(table: dict, title: str = "baseline vs optimized") -> str:
    lines = [
        f"### {title}",
        "",
        "| metric | baseline | optimized | change |",
        "|---|---:|---:|---:|",
    ]
    lines += [f"| {m} | {a} | {b} | {c} |" for m, a, b, c in rows(table)]
    return "\n".join(lines) + "\n"
