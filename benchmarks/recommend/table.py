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
