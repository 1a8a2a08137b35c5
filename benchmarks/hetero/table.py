"""`hetflow bench hetero`'s table: every variant's figures side by side, a median over the
rounds with its min-max, and the order each round ran the variants in."""

from __future__ import annotations

from benchmarks import wide_console


def print_table(out: dict) -> None:
    from rich.table import Table

    t = Table(
        title=f"speeds {out['speeds']}, {out['steps']} steps, "
        f"stragglers {out['stragglers'] or 'none'}, "
        f"all-reduce {out['allreduce_s'] * 1e3:.1f} ms"
    )
    rows = [
        "end_to_end_time_to_baseline_final_s",
        "end_to_end_time_to_target_speedup",
        "end_to_end_time_to_target_s",
        "end_to_end_s",
        "end_to_end_speedup",
        "profiling_time_s",
        "startup_s",
        "trials_s",
        "steady_samples_per_s",
        "throughput_samples_per_s",
        "bound_samples_per_s",
        "plan_bound_samples_per_s",
        "efficiency_vs_bound",
        "efficiency_vs_bound_with_allreduce",
        "ideal_samples_per_s",
        "efficiency",
        "efficiency_vs_ideal_with_allreduce",
        "efficiency_at_run_pace",
        *(["efficiency_runs"] if out.get("repeat", 1) > 1 else []),
        "speedup_vs_baseline",
        "time_to_target_s",
        "time_to_baseline_final_s",
        "time_to_target_speedup",
        "final_accuracy",
        "final_val_loss",
        "busy_fraction",
        "comm_fraction",
        "straggler_idle_fraction",
        "data_wait_fraction",
        "compute_model_error",
        "host_pace",
        "compute_model_error_at_run_pace",
        "replans",
        "steps_to_final_rate",
        "final_plan",
        "run_s",
    ]
    t.add_column("metric", no_wrap=True)
    for name in out["variants"]:
        t.add_column(name, justify="right")
    for row in rows:
        t.add_row(row, *(cell(r, row) for r in out["variants"].values()))
    wide_console(140).print(t)
    for r, order in enumerate(out.get("orders", [])):
        print(f"round {r} ran {', '.join(order)}")


def cell(r: dict, row: str) -> str:
    """Variant row `r`'s figure `row` as text: a median over rounds with its min-max after it
    (`123.456 (120.000-125.000)`), a list in brackets, '-' where there is none."""
    v = r.get(row)
    if isinstance(v, list) and v and not isinstance(v[0], int):
        form = "+.2f" if row.startswith("compute_model_error") else ".3f"
        return "[" + ", ".join("-" if e is None else format(e, form) for e in v) + "]"
    text = "-" if v is None else f"{v:.3f}" if isinstance(v, float) else str(v)
    spread = r.get(f"{row}_range")
    if spread and spread[0] != spread[1]:
        text += f" ({spread[0]:.3f}-{spread[1]:.3f})"
    return text
