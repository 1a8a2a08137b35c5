"""`hetflow bench comm`'s printed tables: every method's figures, the survey's shape, and
what `auto` picked (from the benchmark's JSON, `benchmarks.comm.summary`)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from benchmarks import wide_console
from benchmarks.comm.figures import quality

if TYPE_CHECKING:
    from rich.table import Table

# The survey table the issue quotes (Xu et al., "Compressed communication for distributed deep
# learning: survey and quantitative evaluation"), for reference next to ours.
LITERATURE = [
    ("top-1% sparsification", "100x", "0.3"),
    ("8-bit quantization", "4x", "0.1"),
    ("1-bit quantization", "32x", "0.5"),
]


def _fmt(v, spec: str) -> str:
    return "-" if v is None else format(v, spec)


def _methods_table(out: dict) -> Table:
    """Every method's figures, the chosen one marked."""
    from rich.table import Table

    link = f"{out['link_gbps']:g} Gbit/s" if out["link_gbps"] else "loopback"
    t = Table(
        title=f"{out['recipe']} ({out['params'] / 1e6:.2f}M params), {out['world']} ranks, {link}, "
        f"latency {out['latency_ms']:g} ms, {out['steps']} steps "
        f"(times and bytes from step {out['timed_from_step']}, top-k after its density stages)"
    )
    cols = [
        "method",
        "MB/step/rank",
        "ratio",
        "step ms",
        "compute ms",
        "comm ms",
        "vs none",
        "final loss",
        "accuracy | val_loss",
        "Δ pp",
    ]
    for c in cols:
        t.add_column(c, justify="left" if c == "method" else "right")
    for name, r in out["methods"].items():
        mark = " (chosen)" if name == out["chosen"] else ""
        t.add_row(
            name + mark,
            f"{r['bytes_per_step'] / 1e6:.3f}",
            f"{r['compression_ratio']:.1f}x",
            f"{r['step_time_s'] * 1e3:.0f}",
            f"{r['compute_time_s'] * 1e3:.0f}",
            f"{r['comm_time_s'] * 1e3:.0f}",
            _fmt(r["step_time_vs_none"], ".2f"),
            f"{r['final_loss']:.4f}",
            quality(r).split(" ")[-1],
            _fmt(r["accuracy_delta_pp"], "+.2f"),
        )
    return t


def _survey_table(out: dict) -> Table:
    """Our methods in the survey's shape, with the survey's rows (LITERATURE) beside them."""
    from rich.table import Table

    s = Table(title="In the survey's shape: compression ratio and accuracy loss (ours, measured)")
    for c in ("method", "compression ratio", "accuracy loss (pp)", "source"):
        s.add_column(
            c, justify="right" if c in ("compression ratio", "accuracy loss (pp)") else "left"
        )
    for name, r in out["methods"].items():
        loss = None if r["accuracy_delta_pp"] is None else 0.0 - r["accuracy_delta_pp"]
        s.add_row(name, f"{r['compression_ratio']:.1f}x", _fmt(loss, "+.2f"), "measured here")
    for name, ratio, loss in LITERATURE:
        s.add_row(name, ratio, loss, "survey (reference)", style="dim")
    return s


def _auto_line(out: dict) -> str:
    """What `auto` picked on this link and, unless that is `none`, the step time it saved."""
    cut = out["chosen_step_time_cut"]
    tail = ""
    if cut is not None and out["chosen"] != "none":
        tail = f", {abs(cut):.0%} {'less' if cut >= 0 else 'more'} step time than none"
        if len(out["chosen_step_time_cut_runs"]) > 1:
            tail += (
                " (median step times; per round: "
                + ", ".join(f"{c:.0%}" for c in out["chosen_step_time_cut_runs"])
                + ")"
            )
    tried = ", ".join(
        f"{t['method']} {t['step_s'] * 1e3:.0f} ms" if t["step_s"] else f"{t['method']} failed"
        for t in out["trials"]
    )
    return f"auto on this link: {out['chosen']} (by trials' steps: {tried}){tail}"


def print_tables(out: dict) -> None:
    """The methods' table, the survey-shaped one, and what `auto` picked."""
    console = wide_console(150)
    console.print(_methods_table(out))
    console.print(_survey_table(out))
    print(_auto_line(out))
