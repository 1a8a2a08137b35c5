"""Plots a person would rather look at than read (PNG, matplotlib's Agg backend)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt

from hetflow.records import StepRecord

PARTS = (
    ("data_s", "data wait", "#9e9e9e"),
    ("compute_s", "compute", "#2e7d32"),
    ("comm_s", "communication", "#1565c0"),
    ("idle_s", "idle", "#ef6c00"),
)


def timeline(
    rank_records: Sequence[Sequence[StepRecord]], path: Path, last_steps: int = 12, title: str = ""
) -> Path:
    """One row per rank: what each of the last steps was spent on, in wall-clock order."""
    fig, ax = plt.subplots(figsize=(10, 0.6 * len(rank_records) + 1.5))
    for r, records in enumerate(rank_records):
        t = 0.0
        for rec in records[-last_steps:]:
            for key, _, color in PARTS:
                width = max(getattr(rec, key), 0.0)
                ax.broken_barh([(t, width)], (r - 0.4, 0.8), facecolors=color)
                t += width
    ax.set_yticks(range(len(rank_records)), [f"rank {r}" for r in range(len(rank_records))])
    ax.invert_yaxis()
    ax.set_xlabel("seconds (last steps of the run)")
    ax.legend(
        handles=[plt.Rectangle((0, 0), 1, 1, color=c) for _, _, c in PARTS],
        labels=[label for _, label, _ in PARTS],
        loc="upper center",
        ncol=4,
        bbox_to_anchor=(0.5, -0.25),
    )
    ax.set_title(title or "per-rank timeline")
    return _save(fig, path)


def step_series(series: Sequence[Mapping[str, float]], path: Path, title: str = "") -> Path:
    """Step time and per-rank local batch over the run: how the plan evolved."""
    steps = [row["step"] for row in series]
    fig, (a, b) = plt.subplots(2, 1, figsize=(9, 6), sharex=True)
    a.plot(steps, [row["step_time_s"] for row in series], color="#1565c0")
    a.set_ylabel("step time (s)")
    for key in sorted(k for k in series[0] if k.endswith("/local_batch")):
        b.plot(steps, [row[key] for row in series], label=key.split("/")[0])
    b.set_ylabel("local batch")
    b.set_xlabel("step")
    b.legend(ncol=4, fontsize="small")
    a.set_title(title or "step time and plan")
    return _save(fig, path)


def busy_comparison(
    baseline: Mapping[str, float], optimized: Mapping[str, float], path: Path
) -> Path:
    """Per-rank busy fraction, baseline vs optimized."""
    ranks = sorted({int(k[4:].split("/")[0]) for k in baseline if k.endswith("/busy_fraction")})
    fig, ax = plt.subplots(figsize=(7, 4))
    width = 0.38
    for sign, label, metrics in ((-1, "baseline", baseline), (1, "optimized", optimized)):
        busy = [metrics[f"rank{r}/busy_fraction"] for r in ranks]
        ax.bar([r + sign * width / 2 for r in ranks], busy, width, label=label)
    ax.set_xticks(ranks, [f"rank {r}" for r in ranks])
    ax.set_ylim(0, 1)
    ax.set_ylabel("busy fraction (compute / training time)")
    ax.legend()
    ax.set_title("per-rank busy fraction")
    return _save(fig, path)


def _save(fig, path: Path) -> Path:
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path
