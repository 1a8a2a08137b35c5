"""`hetflow bench recommend`'s table: each choice predicted against measured."""

from __future__ import annotations

from benchmarks import wide_console

COLUMNS = (
    ("mix", "mix", "{}"),
    ("predicted_step_s", "pred step ms", "ms"),
    ("measured_step_s", "meas step ms", "ms"),
    ("predicted_compute_s", "pred compute ms", "ms"),
    ("measured_compute_s", "meas compute ms", "ms"),
    ("predicted_hours", "pred h", "{:.3f}"),
    ("measured_hours", "meas h", "{:.3f}"),
    ("predicted_cost_usd", "pred $", "{:.2f}"),
    ("measured_cost_usd", "meas $", "{:.2f}"),
    ("hours_error", "time err", "{:+.1%}"),
    ("cost_error", "cost err", "{:+.1%}"),
    ("host_drift", "host drift", "{:+.1%}"),
)


def cell(value, fmt: str) -> str:
    if fmt == "ms":
        return f"{value * 1e3:.1f}"
    return fmt.format(value)


def print_table(out: dict) -> None:
    from rich.table import Table

    flags = out["flags"]
    t = Table(
        title=f"{flags['job_recipe']}, global batch {flags['global_batch']}, {flags['steps']} "
        f"steps, deadline {flags['deadline_h']:g} h ({flags['run_steps']} steps run of "
        f"{flags['stand_in']}, time scale {flags['time_scale']:g})"
    )
    t.add_column("choice")
    for _, head, _ in COLUMNS:
        t.add_column(head, justify="left" if head == "mix" else "right")
    for name, row in out["choices"].items():
        t.add_row(name, *(cell(row[key], fmt) for key, _, fmt in COLUMNS))
    wide_console(190).print(t)
    vs = out["versus_naive"]
    if vs["best_naive"] is None:
        print("no naive choice met the deadline (measured)")
    else:
        print(
            f"recommended vs the best naive choice that met the deadline ({vs['best_naive']}): "
            f"{vs['saving']:+.1%} cheaper, measured; recommended met it: "
            f"{vs['recommended_meets_deadline']}"
        )
    print(f"largest |error| of time and cost: {out['max_abs_error']:.1%}")


QUOTA_COLUMNS = (
    ("mix", "mix", "{}"),
    ("local_batches", "local batches", "{}"),
    ("predicted_step_s", "pred step ms", "ms"),
    ("measured_step_s", "meas step ms", "ms"),
    ("step_error", "step err", "{:+.1%}"),
    ("predicted_train_s", "pred train s", "{:.2f}"),
    ("measured_train_s", "meas train s", "{:.2f}"),
    ("train_error", "train err", "{:+.1%}"),
    ("measured_wall_s", "wall s", "{:.1f}"),
    ("predicted_cost_usd", "pred $", "{:.4f}"),
    ("measured_cost_usd", "meas $", "{:.4f}"),
    ("cost_error", "cost err", "{:+.1%}"),
    ("load_before", "load", "{:.1f}"),
)


def share(value: float | None) -> str:
    return "?" if value is None else f"{value:.0%}"


def print_quota_table(out: dict) -> None:
    """`--cpu-quotas`: each run of each mix, predicted against measured, then each worker."""
    from rich.table import Table

    flags = out["flags"]
    quotas = ", ".join(f"{t} {q:g}" for t, q in out["quota_rule"].items())
    t = Table(
        title=f"{flags['stand_in']}, global batch {flags['global_batch']}, {flags['run_steps']} "
        f"steps run, {flags['steps']} priced; CPU quotas (cores per GPU worker): {quotas}"
    )
    for _, head, _ in QUOTA_COLUMNS:
        t.add_column(head, justify="left" if head in ("mix", "local batches") else "right")
    for row in out["runs"]:
        t.add_row(*(cell(row[key], fmt) for key, _, fmt in QUOTA_COLUMNS))
    wide_console(190).print(t)
    for name, p in out["profiles"].items():
        print(
            f"  profile of {name} alone on {p['cpu_quota']:g} cores: {p['fit_latency_s'] * 1e3:.2f}"
            f" ms + {p['fit_s_per_sample'] * 1e3:.3f} ms a sample; quota used up in "
            f"{share(p['throttled_share'])} of its periods"
        )
    for row in out["runs"]:
        for w in row["workers"]:
            print(
                f"  {row['mix']} round {row['round']}: {w['worker']} quota {w['cpu_quota']:g} "
                f"(kernel {w['kernel_cpu_quota']}), batch {w['local_batch']}: compute "
                f"{w['predicted_compute_s'] * 1e3:.1f} ms predicted, "
                f"{w['measured_compute_s'] * 1e3:.1f} measured ({w['compute_error']:+.1%}); "
                f"quota used up in {share(w['throttled_share'])} of its periods"
            )
    verdict = "within" if out["within_goal"] else "not within"
    print(
        f"recommended: {out['recommended']}; step and training time {verdict} "
        f"{out['goal']:.0%} on every run"
    )
