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
    """The published comparison: epoch minutes, efficiency, the assumptions and the gap."""
    from rich.table import Table

    console = _console()
    t = Table(title="ResNet-50 on V100s, minutes per epoch: published vs simulated")
    for c in ("GPUs", "theirs", "ours", "error", "our efficiency"):
        t.add_column(c, justify="right")
    for r in pub["resnet50_v100_epoch"]:
        t.add_row(
            str(r["gpus"]),
            f"{r['theirs_min']:.0f}",
            f"{r['ours_min']:.1f}",
            f"{r['rel_error']:+.1%}",
            f"{r['ours_efficiency']:.3f}",
        )
    console.print(t)
    e = Table(title="Scaling efficiency at 16-1024 nodes: published vs simulated")
    for c in ("model", "nodes", "theirs", "ours", "error", "comm share"):
        e.add_column(c, justify="left" if c == "model" else "right")
    for r in pub["scaling_efficiency"]:
        e.add_row(
            r["model"],
            str(r["nodes"]),
            f"{r['theirs']:.2f}",
            f"{r['ours']:.3f}",
            f"{r['rel_error']:+.1%}",
            f"{r['comm_share']:.1%}",
        )
    console.print(e)
    for name, a in pub["assumptions"].items():
        figures = ", ".join(f"{k}={v}" for k, v in a.items() if k != "note")
        console.print(f"[bold]{name}[/bold]: " + figures)
        console.print(f"  {a['note']}")
    console.print(pub["gap"])


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
    for model in ("resnet50", "bert-large"):
        rs = [r for r in pub["scaling_efficiency"] if r["model"] == model]
        ax.plot([r["nodes"] for r in rs], [r["theirs"] for r in rs], "k--", alpha=0.5)
        ax.plot(
            [r["nodes"] for r in rs],
            [r["ours"] for r in rs],
            "x:",
            label=f"{model}: ours (published setup)",
        )


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
