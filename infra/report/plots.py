"""Plots a person would rather look at than read (PNG, matplotlib's Agg backend).

Ranks are labelled by worker (`rank_labels`): its name, its emulated speed and, where a profile
is given, its measured speed relative to the fastest worker.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt

from hetflow.config import ClusterSpec
from hetflow.figures import StepFigures
from hetflow.records import Profile, RankResult, RunResult, StepRecord

PARTS = (
    ("data_s", "data wait", "#9e9e9e"),
    ("compute_s", "compute", "#2e7d32"),
    ("comm_s", "communication", "#1565c0"),
    ("idle_s", "idle", "#ef6c00"),
)
VARIANT_COLORS = {
    "baseline": "#757575",
    "optimized": "#c62828",
    "static": "#1565c0",
    "dynamic": "#c62828",
}
LABEL_NOTE = "worker (emulated speed; measured speed / fastest's)"


def rank_labels(cluster: ClusterSpec, profile: Profile | None = None) -> list[str]:
    """One label per rank: 'w3 · 4x (measured 0.98)' for an emulated worker (its speed as
    the cluster states it; the profile's `relative_speed`, none from a prior), 'g5-a ·
    g5.xlarge (...)' for one that names an instance type, else its name.

    >>> from hetflow.config import ClusterSpec
    >>> rank_labels(ClusterSpec.from_speeds([1, 2]))
    ['w0 · 1x', 'w1 · 2x']
    """
    measured = {}  # by worker name (a run may launch fewer workers than were profiled)
    for i, r in enumerate(profile.ranks if profile is not None and not profile.prior else []):
        name = r.worker or (cluster.workers[i].name if i < len(cluster.workers) else "")
        measured[name] = r.relative_speed
    labels = []
    for w in cluster.workers:
        label = w.name
        if w.instance_type:
            label += f" · {w.instance_type}"
        elif cluster.emulate:
            label += f" · {w.speed:g}x"
        if measured.get(w.name):
            label += f" (measured {measured[w.name]:.2f})"
        labels.append(label)
    return labels


def rank_rows(
    result: RunResult, cluster: ClusterSpec | None, profile: Profile | None = None
) -> tuple[list[list[StepRecord]], list[str] | None]:
    """The per-rank timeline's rows (`timeline`): the ranks at the run's end in rank order,
    then those that left in place (`RunResult.departed`), then those lost there
    (`RunResult.lost`, as the survivors rebuilt them), each labelled by the worker it ran as
    (`RankResult.worker_index`: its `rank_labels` label, or its own name where it was added
    in place under one; '(left before step N)' where it left, '(lost after step N)' where it
    was lost, N its last step known), never by its position among the ranks, which a leave
    or a join shifts; no labels without `cluster`.

    >>> from hetflow.records import RankResult
    >>> r = lambda rank, worker="": RankResult(rank=rank, worker=worker, records=[], plans=[])
    >>> rank_rows(RunResult(ranks=[r(2), r(0)], departed=[r(1, "w1")], lost=[r(3, "w3")]),
    ...     ClusterSpec.from_speeds([1, 2, 4, 8]))[1]
    ['w0 · 1x', 'w2 · 4x', 'w1 · 2x (left)', 'w3 · 8x (lost)']
    """
    ranks = [*sorted(result.ranks, key=lambda r: r.rank), *result.departed, *result.lost]
    rows = [r.records for r in ranks]
    if cluster is None:
        return rows, None
    names, by_index = [w.name for w in cluster.workers], rank_labels(cluster, profile)
    labels = []
    for k, r in enumerate(ranks):
        i = r.worker_index(cluster)
        own = r.worker in ("", *names[i : i + 1])
        label = by_index[i] if own and i < len(names) else r.worker or f"rank {r.rank}"
        labels.append(label + _gone(r, k - len(result.ranks), len(result.departed)))
    return rows, labels


def _gone(r: RankResult, k: int, departed: int) -> str:
    """What a row's label adds for the `k`-th rank past those at the end: a leaver's step it
    left before, a lost rank's last step known; nothing for a rank at the end (`k` < 0)."""
    if k < 0:
        return ""
    if k < departed:
        return f" (left before step {r.records[-1].step + 1})" if r.records else " (left)"
    return f" (lost after step {r.records[-1].step})" if r.records else " (lost)"


def _labels(labels: Sequence[str] | None, n: int) -> list[str]:
    return list(labels) if labels and len(labels) == n else [f"rank {r}" for r in range(n)]


def _legend_parts(ax) -> None:
    ax.legend(
        handles=[plt.Rectangle((0, 0), 1, 1, color=c) for _, _, c in PARTS],
        labels=[label for _, label, _ in PARTS],
        loc="upper center",
        ncol=4,
        bbox_to_anchor=(0.5, -0.2),
    )


def _bars(ax, rank_records: Sequence[Sequence[StepRecord]], last_steps: int, y0: int) -> None:
    """Each rank's last steps as stacked bars, rank r on row y0 + r."""
    for r, records in enumerate(rank_records):
        t = 0.0
        for rec in records[-last_steps:]:
            for key, _, color in PARTS:
                width = max(getattr(rec, key), 0.0)
                ax.broken_barh([(t, width)], (y0 + r - 0.4, 0.8), facecolors=color)
                t += width


def timeline(
    rank_records: Sequence[Sequence[StepRecord]],
    path: Path,
    last_steps: int = 12,
    title: str = "",
    labels: Sequence[str] | None = None,
) -> Path:
    """One row per rank (labelled `labels`): what each of the last steps was spent on, in
    wall-clock order."""
    n = len(rank_records)
    fig, ax = plt.subplots(figsize=(10, 0.6 * n + 1.8))
    _bars(ax, rank_records, last_steps, 0)
    ax.set_yticks(range(n), _labels(labels, n))
    ax.invert_yaxis()
    ax.set_xlabel(f"seconds (the last {last_steps} steps of the run)")
    _legend_parts(ax)
    ax.set_title(title or "per-rank timeline")
    return _save(fig, path)


def same_lines(series: Mapping[str, Sequence[float]]) -> list[tuple[list[str], Sequence[float]]]:
    """Lines grouped by their values: ([labels], values) once per distinct line, in first-seen
    order, so that equal lines are drawn once and named together.

    >>> same_lines({"w0": [32, 32], "w1": [32, 32], "w2": [64, 48]})
    [(['w0', 'w1'], [32, 32]), (['w2'], [64, 48])]
    """
    groups: dict[tuple, tuple[list[str], Sequence[float]]] = {}
    for label, values in series.items():
        groups.setdefault(tuple(values), ([], values))[0].append(label)
    return list(groups.values())


def step_series(
    series: Sequence[StepFigures],
    path: Path,
    title: str = "",
    labels: Sequence[str] | None = None,
) -> Path:
    """Step time and per-rank local batch over the run: how the plan evolved. Ranks whose
    batches are equal throughout share one line, named after all of them."""
    steps = [row.step for row in series]
    fig, (a, b) = plt.subplots(2, 1, figsize=(9, 6), sharex=True)
    a.plot(steps, [row.step_time_s for row in series], color="#1565c0")
    a.set_ylabel("step time (s)")
    # every rank of any step: under `on_loss: continue` a rank that left is in the rows up to
    # its leave only (0 after it)
    ranks = sorted({r.rank for row in series for r in row.ranks})
    names = _labels(labels, max(ranks, default=-1) + 1)
    batch = [{r.rank: r.local_batch for r in row.ranks} for row in series]
    lines = {names[r]: [b.get(r, 0) for b in batch] for r in ranks}
    for group, values in same_lines(lines):
        names_only = ", ".join(g.split(" · ")[0] for g in group)
        label = group[0] if len(group) == 1 else f"{names_only}: equal, one line for all"
        b.plot(steps, values, label=label)
    b.set_ylabel("local batch")
    b.set_xlabel("step")
    b.legend(fontsize="small", title=LABEL_NOTE, title_fontsize="small")
    a.set_title(title or "step time and plan")
    return _save(fig, path)


def rolling_rate(
    step_s: Sequence[float], samples: Sequence[int] | int, window: int = 10
) -> list[float]:
    """Samples/s at each step over the `window` steps up to it (fewer at the start), from each
    step's time and samples (or one global batch for all) (pure).

    >>> rolling_rate([0.1, 0.1, 0.3, 0.1], 10, window=2)
    [100.0, 100.0, 50.0, 50.0]
    """
    counts = [samples] * len(step_s) if isinstance(samples, int) else list(samples)
    out = []
    for i in range(len(step_s)):
        lo = max(0, i + 1 - window)
        total = sum(step_s[lo : i + 1])
        out.append(sum(counts[lo : i + 1]) / total if total > 0 else 0.0)
    return out


def step_samples(ranks: Sequence[Sequence[StepRecord]]) -> list[int]:
    """The samples of each of the first rank's steps, summed over the ranks that ran that
    step (a rank that joined or left mid-run ran fewer) (pure).

    >>> from hetflow.records import StepRecord
    >>> r = lambda s, b: StepRecord(
    ...     step=s, batch=b, data_s=0, compute_s=0, wait_s=0, step_s=0, loss_sum=0, bytes_sent=0
    ... )
    >>> step_samples([[r(0, 8), r(1, 6)], [r(1, 2)]])
    [8, 8]
    """
    per_step: dict[int, int] = {}
    for recs in ranks:
        for x in recs:
            per_step[x.step] = per_step.get(x.step, 0) + x.batch
    return [per_step[x.step] for x in ranks[0]]


def rate_curves(
    rates: Mapping[str, Sequence[float]], path: Path, title: str = "", window: int = 10
) -> Path:
    """Each variant's samples/s against steps (`rolling_rate` over `window` steps), one line a
    variant on one axis: how soon a plan that learns reaches the rate of one that was planned
    before its first step."""
    fig, ax = plt.subplots(figsize=(9, 4.5))
    for variant, values in rates.items():
        ax.plot(range(len(values)), values, label=variant, color=VARIANT_COLORS.get(variant))
    ax.set_xlabel("step")
    ax.set_ylabel(f"samples/s (over the last {window} steps)")
    ax.set_ylim(bottom=0)
    ax.legend()
    ax.set_title(title or "rate against steps")
    return _save(fig, path)


def side_by_side(
    runs: Mapping[str, Sequence[Sequence[StepRecord]]],
    path: Path,
    labels: Sequence[str] | Mapping[str, Sequence[str]] | None = None,
    last_steps: int = 12,
) -> Path:
    """The variants on one time axis. Top: each variant's last steps per rank (baseline's ranks,
    then optimized's), so that the same number of steps shows how long each took. Bottom:
    rank 0's step time against training time, one line per variant. `labels`: the ranks', or
    each variant's (a variant may launch fewer workers)."""
    n = max(len(r) for r in runs.values())
    last_steps = min(last_steps, *(len(r[0]) for r in runs.values()))
    fig, (top, bottom) = plt.subplots(
        2, 1, figsize=(11, 0.55 * n * len(runs) + 5), height_ratios=[n * len(runs) * 0.6 + 1, 2.5]
    )
    ticks, ticklabels = [], []
    for i, (variant, rank_records) in enumerate(runs.items()):
        y0 = i * (n + 1)
        _bars(top, rank_records, last_steps, y0)
        ticks += [y0 + r for r in range(len(rank_records))]
        own = labels.get(variant) if isinstance(labels, Mapping) else labels
        names = _labels(own, len(rank_records))
        ticklabels += [f"{variant} · {names[r]}" for r in range(len(rank_records))]
        lead = rank_records[0]
        clock = [sum(x.step_s for x in lead[: j + 1]) for j in range(len(lead))]
        bottom.plot(
            clock,
            [x.step_s for x in lead],
            label=variant,
            color=VARIANT_COLORS.get(variant),
            marker=".",
        )
    top.set_yticks(ticks, ticklabels)
    top.invert_yaxis()
    top.set_xlabel(f"seconds (the last {last_steps} steps of each run, on one axis)")
    top.set_title(f"per-rank timeline; rows: variant · {LABEL_NOTE}")
    _legend_parts(top)
    bottom.set_xlabel("training time (s)")
    bottom.set_ylabel("step time (s)")
    bottom.set_ylim(bottom=0)
    bottom.legend()
    bottom.set_title("step time over the run")
    return _save(fig, path)


def busy_comparison(
    baseline: Mapping[str, float],
    optimized: Mapping[str, float],
    path: Path,
    labels: Sequence[str] | None = None,
) -> Path:
    """Per-rank busy fraction, baseline vs optimized, ranks labelled `labels`."""
    ranks = sorted({int(k[4:].split("/")[0]) for k in baseline if k.endswith("/busy_fraction")})
    fig, ax = plt.subplots(figsize=(8, 4.5))
    width = 0.38
    for sign, label, metrics in ((-1, "baseline", baseline), (1, "optimized", optimized)):
        busy = [metrics[f"rank{r}/busy_fraction"] for r in ranks]
        ax.bar(
            [r + sign * width / 2 for r in ranks],
            busy,
            width,
            label=label,
            color=VARIANT_COLORS[label],
        )
    ax.set_xticks(ranks, _labels(labels, len(ranks)), fontsize="small")
    ax.set_xlabel(LABEL_NOTE)
    ax.set_ylim(0, 1)
    ax.set_ylabel("busy fraction (compute / training time)")
    ax.legend()
    ax.set_title("per-rank busy fraction")
    return _save(fig, path)


def cost_time_front(
    path,
    points: Sequence[tuple[float, float]],
    front: Sequence[tuple[float, float]],
    chosen: tuple[float, float, str],
    title: str,
    deadline_h: float | None = None,
    budget_usd: float | None = None,
) -> Path:
    """Predicted cost against time (log-log) of every mix priced (`points`, hours and dollars),
    the Pareto front joined, the chosen mix ringed and labelled, the deadline or budget dotted
    (`hetflow recommend --plot`, the recommend flow's MLflow image)."""
    import matplotlib.ticker

    fig, ax = plt.subplots(figsize=(7, 4.5))
    ax.scatter([h for h, _ in points], [c for _, c in points], s=6, c="0.7", label="mixes")
    ax.plot([h for h, _ in front], [c for _, c in front], "o-", ms=4, label="Pareto front")
    hours, cost, label = chosen
    ax.plot([hours], [cost], "o", ms=12, mfc="none", mec="C3", label="chosen")
    ax.annotate(label, (hours, cost), fontsize=8)
    if deadline_h is not None:
        ax.axvline(deadline_h, color="C3", ls=":", label="deadline")
    if budget_usd is not None:
        ax.axhline(budget_usd, color="C3", ls=":", label="budget")
    ax.set(xscale="log", yscale="log", xlabel="predicted time (h)", ylabel="predicted cost ($)")
    for axis in (ax.xaxis, ax.yaxis):
        axis.set_minor_formatter(matplotlib.ticker.NullFormatter())
    ax.set_title(title)
    ax.legend(fontsize=8)
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120, bbox_inches="tight")
    plt.close(fig)
    return Path(path)


def _save(fig, path: Path) -> Path:
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


def worker_timeline(spans: Sequence[tuple[str, str, float, float]], workers: Sequence[str]):
    """A draw of which job held which worker when: one row per worker of `workers`, one bar
    per `(job, worker, from_s, to_s)` of `spans`, a colour per job."""

    def draw(path: Path) -> None:
        jobs = sorted({s[0] for s in spans})
        colours = {j: plt.get_cmap("tab10")(i % 10) for i, j in enumerate(jobs)}
        fig, ax = plt.subplots(figsize=(9, 0.5 * len(workers) + 1.5))
        for job, worker, a, b in spans:
            row = list(workers).index(worker)
            ax.barh(row, b - a, left=a, color=colours[job], edgecolor="white")
        ax.set_yticks(range(len(workers)), list(workers))
        ax.set_xlabel("seconds since the queue started")
        handles = [plt.Rectangle((0, 0), 1, 1, color=colours[j]) for j in jobs]
        ax.legend(handles, jobs, loc="upper right", fontsize="small")
        ax.set_title("which job held which worker")
        fig.tight_layout()
        fig.savefig(path)
        plt.close(fig)

    return draw
