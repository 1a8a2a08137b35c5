"""What `hetflow simulate` prints and draws: rich tables of the predictions, the published
comparison and the calibration, and a PNG of efficiency against workers."""

from __future__ import annotations

import json
from pathlib import Path

from hetflow.output import wide_console


def _console():
    return wide_console(140)


def _hms(seconds: float) -> str:
    if seconds >= 3600:
        return f"{seconds / 3600:.2f} h"
    if seconds >= 60:
        return f"{seconds / 60:.1f} min"
    return f"{seconds:.1f} s"


def _rows_title(out: dict) -> str:
    m, net, job = out["model"], out["network"], out["job"]
    batch = (
        f"local batch {job['local_batch']}"
        if job["local_batch"]
        else f"global batch {job['global_batch']}"
    )
    return (
        f"{m['name']} ({m['params'] / 1e6:.1f}M params, {m['per_sample_gflop']:.3g} "
        f"GFLOP/sample), {batch}, {net['collective']} all-reduce (alpha "
        f"{net['alpha_us']:.3g} µs, {net['buckets_per_step']} buckets, compression "
        f"{net['compression_ratio']:g}x, overlap {net['overlap']:g})"
    )


def print_rows(out: dict) -> None:
    """The simulation's rows as a table, then the cluster and how long simulating took."""
    from rich.table import Table

    t = Table(title=_rows_title(out))
    for c in (
        "workers",
        "plan",
        "local batch",
        "step ms",
        "comm ms",
        "samples/s",
        "efficiency",
        "speedup",
        "epoch",
        "$/h",
        "$/epoch",
    ):
        t.add_column(c, justify="left" if c == "plan" else "right")
    for r in out["rows"]:
        lb = (
            str(r["local_batch_min"])
            if r["local_batch_min"] == r["local_batch_max"]
            else f"{r['local_batch_min']}-{r['local_batch_max']}"
        )
        t.add_row(
            str(r["workers"]),
            r["plan"],
            lb,
            f"{r['step_time_s'] * 1e3:.1f}",
            f"{r['comm_s'] * 1e3:.1f}",
            f"{r['throughput_samples_per_s']:,.0f}",
            f"{r['efficiency']:.3f}",
            f"{r['speedup_vs_baseline']:.2f}x",
            _hms(r["epoch_time_s"]),
            f"{r['usd_per_hour']:.2f}",
            f"{r['cost_per_epoch']:.2f}",
        )
    console = _console()
    console.print(t)
    biggest = max(out["simulate_s_by_workers"])
    console.print(f"cluster: {json.dumps(out['cluster'])}")
    console.print(
        f"simulated in {out['simulate_s'] * 1e3:.0f} ms; {biggest} workers (both plans) "
        f"in {out['simulate_s_by_workers'][biggest] * 1e3:.0f} ms"
    )


def print_published(pub: dict) -> None:
    """Each published row beside ours with the role it played in the fit, the sources, the
    fitted figures, and the error on the held-out rows."""
    from rich.table import Table

    console = _console()
    t = Table(title="Published training throughput (samples/s) vs simulated")
    for c in ("table", "GPUs", "nodes", "role", "theirs", "ours", "error", "comm share"):
        t.add_column(c, justify="left" if c in ("table", "role") else "right")
    for r in pub["rows"]:
        t.add_row(
            r["table"],
            str(r["gpus"]),
            str(r["nodes"]),
            r["role"],
            f"{r['theirs_samples_per_s']:,.2f}",
            f"{r['ours_samples_per_s']:,.2f}",
            f"{r['rel_error']:+.1%}",
            f"{r['comm_share']:.1%}",
        )
    console.print(t)
    for info in pub["tables"]:
        link = info["fitted_node_gbps"]
        fitted = f"c {info['fitted_per_sample_ms']:.3g} ms/sample" + (
            f", link {link:.0f} Gbit/s per node" if link else ""
        )
        console.print(f"[bold]{info['key']}[/bold]: {info['source']} ({info['section']}); {fitted}")
    console.print(f"fitted alpha {pub['fitted']['alpha_us']:.1f} µs per hop per bucket")
    console.print("assumed: " + "; ".join(pub["assumptions"]))
    console.print(
        f"held-out error (rows not fitted): max {pub['held_out_max_abs_error']:.1%}, "
        f"mean {pub['held_out_mean_abs_error']:.1%} over {pub['held_out_rows']} rows; "
        f"fit rows: max {pub['fit_max_abs_error']:.1%} over {pub['fit_rows']}"
    )


def print_calibration(cal: dict) -> None:
    """Each calibration run, measured beside predicted, and the errors."""
    from rich.table import Table

    t = Table(title="Calibration: runs made here, predicted from their own profiles")
    for c in (
        "run",
        "plan",
        "measured samples/s",
        "predicted",
        "error",
        "profile only",
        "error",
        "overhead used ms",
    ):
        t.add_column(c, justify="left" if c in ("run", "plan") else "right")
    for name, r in cal["runs"].items():
        t.add_row(
            name,
            str(r["plan"]),
            f"{r['measured_samples_per_s']:.0f}",
            f"{r['predicted_samples_per_s']:.0f}",
            f"{r['error']:+.1%}",
            f"{r['predicted_profile_only_samples_per_s']:.0f}",
            f"{r['error_profile_only']:+.1%}",
            f"{r['overhead_used_s'] * 1e3:.1f}",
        )
    console = _console()
    console.print(t)
    console.print(
        f"hetero_error {cal['hetero_error']:.1%}, comm_error {cal['comm_error']:.1%} "
        f"(profile only: {cal['hetero_error_profile_only']:.1%}, "
        f"{cal['comm_error_profile_only']:.1%}); fitted: {cal['fitted']}"
    )


def _plot_published(ax, pub: dict) -> None:
    """Theirs (dashed) and ours (dotted) against GPUs, as throughput over n / n0 x the first
    row's, for the tables with more than two rows."""
    keys = dict.fromkeys(r["table"] for r in pub["rows"])
    for key in keys:
        rs = [r for r in pub["rows"] if r["table"] == key]
        if len(rs) < 3:
            continue
        gpus = [r["gpus"] for r in rs]
        (line,) = ax.plot(gpus, [r["ours_scaling"] for r in rs], "x:", label=f"{key}: ours")
        ax.plot(gpus, [r["theirs_scaling"] for r in rs], "--", color=line.get_color(), alpha=0.6)


def plot(out: dict, path: str) -> None:
    """PNG at `path`: efficiency against workers per plan, and the published curves if any."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.5))
    rows = out.get("rows") or []
    for plan, style in (("baseline", "o-"), ("optimized", "s-")):
        pts = [(r["workers"], r["efficiency"]) for r in rows if r["plan"] == plan]
        if pts:
            ax.plot(
                *zip(*pts, strict=True),
                style,
                label=f"{out['model']['name']} on this cluster: {plan}",
            )
    pub = out.get("published")
    if pub:
        _plot_published(ax, pub)
    ax.set_xscale("log", base=2)
    ax.set_xlabel("workers")
    ax.set_ylabel("scaling efficiency")
    ax.set_ylim(0, 1.05)
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=8)
    ax.set_title(
        "hetflow simulate: efficiency against workers" + (" (dashed: published)" if pub else "")
    )
    fig.tight_layout()
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
