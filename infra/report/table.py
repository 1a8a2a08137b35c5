"""The side-by-side table of two runs (pure): the same rows in the terminal, Prefect and MLflow.

A row says what it is: a worker's local batch is the plan in force at the start and the one
in force at the end, where a re-plan changed it (`rank{r}/start_local_batch` beside
`rank{r}/local_batch`, the last step's); the time to the target names the target and reads
"not reached" where no evaluation met it. `notes` says, under the table, what the figures do
not: the workers a variant ran without, and why the share of communication grew.

A cell carries its metric's unit, read from the name (`unit`): counts as integers, bytes in
decimal units (1 MB = 10^6 bytes), seconds with `s`, fractions as percentages, rates in
samples/s, costs in dollars. The change column is relative (`+12.3%`), except for fractions,
whose change is the difference in percentage points (`+2.1 pp`): a share that moves from 0.3%
to 0.8% is `+0.5 pp`, not `+166%`.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

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
START_BATCH = "start_local_batch"  # a worker's local batch in the plan the run started with
COUNTS = {
    "steps",
    "replans",
    "restarts",
    "steps_redone",
    "workers_left_out",
    "local_batch",
    START_BATCH,
}
FRACTIONS = {"final_accuracy", "test_accuracy", "cache_hit_ratio", "target_accuracy"}
# the rows timed to the target, and the target of each figure a recipe evaluates: (name in
# the table, the figure it is met on, how it is met)
TO_TARGET = ("end_to_end_time_to_target_s", "time_to_target_s")
TARGETS = {
    "final_accuracy": ("target_accuracy", "accuracy", ">="),
    "final_val_loss": ("target_val_loss", "val_loss", "<="),
}
NOT_REACHED = "not reached"
LEGEND = (
    "change: relative to baseline; for percentages, the difference in percentage points (pp). "
    "1 MB = 10^6 bytes."
)


def table_metrics(metrics: Mapping[str, float | None]) -> list[str]:
    """Headline metrics, then per-rank busy fraction and local batch (at the start, then at the
    end), in rank order."""
    ranks = sorted({r for k in metrics if (r := rank_of(k)) is not None})
    per_rank = [
        f"rank{r}/{m}" for m in ("busy_fraction", START_BATCH, "local_batch") for r in ranks
    ]
    return [k for k in HEADLINE + per_rank if k in metrics]


def comparison(
    baseline: Mapping[str, float],
    optimized: Mapping[str, float],
    *,
    start_batches: Mapping[str, Sequence[int]] | None = None,
    target_accuracy: float | None = None,
    target_val_loss: float | None = None,
) -> dict:
    """{'baseline': {...}, 'optimized': {...}} restricted to the table's metrics.

    `start_batches` (variant -> each cluster worker's local batch in the plan it started with)
    adds `rank{r}/start_local_batch`. The target of the figure the runs evaluate
    (`target_accuracy` for `final_accuracy`, `target_val_loss` for `final_val_loss`) is kept
    under its name, and the rows timed to it are there, None where it was not reached, even
    where neither variant reached it.

    >>> t = comparison({"final_accuracy": 0.9}, {"final_accuracy": 0.96}, target_accuracy=0.95)
    >>> t["baseline"]
    {'time_to_target_s': None, 'final_accuracy': 0.9, 'target_accuracy': 0.95}
    """
    variants = {"baseline": dict(baseline), "optimized": dict(optimized)}
    for name, metrics in variants.items():
        for r, batch in enumerate((start_batches or {}).get(name) or []):
            metrics[f"rank{r}/{START_BATCH}"] = batch
    both = {**variants["baseline"], **variants["optimized"]}
    given = {"target_accuracy": target_accuracy, "target_val_loss": target_val_loss}
    target = _target(both, given)
    keys = table_metrics({**both, **dict.fromkeys(TO_TARGET if target else ())})
    if target:
        # the end-to-end row only where a variant has end-to-end figures at all
        if "end_to_end_s" not in both and "end_to_end_time_to_target_s" not in both:
            keys.remove("end_to_end_time_to_target_s")
        keys.append(target[0])
        for metrics in variants.values():
            metrics[target[0]] = target[1]
    return {name: {k: m.get(k) for k in keys} for name, m in variants.items()}


def _target(
    metrics: Mapping[str, float | None], given: Mapping[str, float | None]
) -> tuple[str, float] | None:
    """(name, value) of the target of the figure `metrics` evaluate, given or kept in them."""
    for figure, (name, _, _) in TARGETS.items():
        value = given.get(name)
        value = value if value is not None else metrics.get(name)
        if figure in metrics and value is not None:
            return name, value
    return None


def rank_of(key: str) -> int | None:
    head, sep, _ = key.partition("/")
    return int(head[4:]) if sep and head.startswith("rank") and head[4:].isdigit() else None


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
        return byte_size(v)
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


def byte_size(v: float) -> str:
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
    """(row, baseline, optimized, change) as text, in the table's order, each row labelled for
    what it is (`label`): the start plan's local batches only where a re-plan changed one, the
    target's value hidden in the label of the rows timed to it."""
    base, opt = table["baseline"], table["optimized"]
    target = _target(base, {}) or _target(opt, {})
    replanned = _replanned(table)
    out = []
    for k in base:
        if k in _TARGET_NAMES or (k.endswith(f"/{START_BATCH}") and not replanned):
            continue
        a, b = base[k], opt[k]
        out.append(
            (
                label(k, target, replanned),
                _cell(base, k, target),
                _cell(opt, k, target),
                change(a, b, k),
            )
        )
    return out


_TARGET_NAMES = {name for name, _, _ in TARGETS.values()}


def label(name: str, target: tuple[str, float] | None = None, replanned: bool | None = None):
    """A row's label: the metric's name, and what it is where the name does not say.

    A worker's `local_batch` is the plan in force at its last step: `(end plan)` beside its
    `(start plan)` where a re-plan changed some worker's (`replanned`), `(start = end plan)`
    where none did, `(last step)` where the start plan is not known (None). A row timed to the
    target names it.

    >>> label("rank2/start_local_batch"), label("rank2/local_batch", replanned=True)
    ('rank2/local_batch (start plan)', 'rank2/local_batch (end plan)')
    >>> label("time_to_target_s", ("target_accuracy", 0.95))
    'time_to_target_s (accuracy ≥ 95.0%)'
    """
    head, _, base = name.rpartition("/")
    if base == START_BATCH:
        return f"{head}/local_batch (start plan)"
    if base == "local_batch" and head:
        what = {None: "last step", True: "end plan", False: "start = end plan"}[replanned]
        return f"{name} ({what})"
    if name in TO_TARGET and target is not None:
        figure, op = next((f, o) for n, f, o in TARGETS.values() if n == target[0])
        return f"{name} ({figure} {'≥' if op == '>=' else '≤'} {fmt(target[1], target[0])})"
    return name


def _replanned(table: dict) -> bool | None:
    """Whether a re-plan changed a worker's local batch in either variant (its start plan
    differs from its last step's); None where the table has no start plan."""
    starts = [k for k in table["baseline"] if k.endswith(f"/{START_BATCH}")]
    if not starts:
        return None
    return any(
        m.get(k) != m.get(k.replace(START_BATCH, "local_batch"))
        for m in table.values()
        for k in starts
    )


def _cell(metrics: dict, name: str, target: tuple[str, float] | None) -> str:
    """`fmt`, with "not reached" for a row timed to a target this variant did not meet."""
    v = metrics.get(name)
    if v is None and target is not None and name in TO_TARGET:
        if metrics.get("time_to_target_s") is None:  # not a missing wall clock: not met
            return NOT_REACHED
    return fmt(v, name)


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
    table: dict,
    title: str = "baseline vs optimized",
    before: str = "",
    after: str = "",
    notes: Sequence[str] = (),
) -> str:
    """The table as a markdown table under `### title` (MLflow renders it in the run's
    description, Prefect in its artifact), with `before` between title and table (a summary),
    the legend and `notes` (a list) below it, and `after` last (links)."""
    lines = [f"### {title}", ""]
    if before:
        lines += [before, ""]
    lines += ["| metric | baseline | optimized | change |", "|---|---:|---:|---:|"]
    lines += [f"| {m} | {a} | {b} | {c} |" for m, a, b, c in rows(table)]
    lines += ["", LEGEND]
    if notes:
        lines += ["", *(f"- {n}" for n in notes)]
    if after:
        lines += ["", after]
    return "\n".join(lines) + "\n"


# a rank's launch by phase, in order (`training.launch.startup`): trials_s is the run's (rank 0's)
PHASES = ("spawn", "import", "rendezvous", "data", "model", "first_step")


def launch_phases(metrics: Mapping[str, float | None]) -> dict[int, dict[str, float]]:
    """Each rank's start-up by phase from a run's flat figures (`rank{r}/startup_NAME_s`, and
    its `rank{r}/startup_s`), by rank; empty where the ranks' phases were not recorded.

    >>> launch_phases({"rank1/startup_s": 5.0, "rank1/startup_import_s": 2.0, "speedup": 1})
    {1: {'import': 2.0, 'startup': 5.0}}
    """
    names = {f"startup_{p}_s": p for p in PHASES} | {"startup_s": "startup"}
    order = list(names.values())
    out: dict[int, dict[str, float]] = {}
    for key, v in metrics.items():
        r, phase = rank_of(key), names.get(key.rsplit("/", 1)[-1])
        if r is not None and phase is not None and v is not None:
            out.setdefault(r, {})[phase] = v
    if not any(p in PHASES for ranks in out.values() for p in ranks):
        return {}
    return {
        r: dict(sorted(p.items(), key=lambda kv: order.index(kv[0])))
        for r, p in sorted(out.items())
    }
