"""`hetflow bench hetero`'s rows over its rounds (pure): speed-ups paired within a round, then
each headline figure's own median with its spread."""

from __future__ import annotations

from hetflow.repeats import with_medians

# the figures a row reports as their own median over the rounds, each with FIGURE_range
HEADLINE_FIGURES = (
    "throughput_samples_per_s",
    "steady_samples_per_s",
    "end_to_end_s",
    "end_to_end_time_to_target_s",
    "efficiency",
    "efficiency_vs_bound",
    "efficiency_vs_bound_with_allreduce",
    "speedup_vs_baseline",
    "end_to_end_speedup",
    "time_to_baseline_final_s",
    "time_to_target_speedup",
    "end_to_end_time_to_baseline_final_s",
    "end_to_end_time_to_target_speedup",
)


def median_run(runs: list[dict]) -> dict:
    """One variant's row over `--repeat` runs (pure): each of `HEADLINE_FIGURES` is that
    figure's own median over the runs, with `FIGURE_range` ([min, max]) beside it
    (`repeats.with_medians`); the other figures (plans, fractions, evaluations) are those of the
    run of median throughput (the lower of the middle two for an even count), so that they
    belong together; `efficiency_runs` lists every run's efficiency in the order they ran."""
    ranked = sorted(runs, key=lambda r: r["throughput_samples_per_s"])
    out = with_medians(ranked[(len(ranked) - 1) // 2], runs, HEADLINE_FIGURES)
    out["efficiency_runs"] = [r["efficiency"] for r in runs]
    return out


def with_speedups(runs: dict[str, list[dict]]) -> dict[str, dict]:
    """Each variant's row over the rounds (`median_run`), its speed-ups taken round by round
    against the baseline of the same round (`round_speedups`) before their medians (pure)."""
    rounds = len(next(iter(runs.values()), []))
    paired = [round_speedups({n: rs[r] for n, rs in runs.items()}) for r in range(rounds)]
    return {name: median_run([p[name] for p in paired]) for name in runs}


def round_speedups(results: dict[str, dict]) -> dict[str, dict]:
    """One round's runs, each with its throughput over the baseline's (`speedup_vs_baseline`,
    None without a baseline), its end-to-end time's (`end_to_end_speedup`) and the times to
    what the baseline ended at (`with_time_to_target`) (pure; the runs given are copied)."""
    results = {name: dict(r) for name, r in results.items()}
    base = baseline_of(results)
    base_tp, base_e2e = base.get("throughput_samples_per_s"), base.get("end_to_end_s")
    for r in results.values():
        r["speedup_vs_baseline"] = r["throughput_samples_per_s"] / base_tp if base_tp else None
        e2e = r.get("end_to_end_s")
        r["end_to_end_speedup"] = base_e2e / e2e if base_e2e and e2e else None
    return with_time_to_target(results)


def baseline_of(results: dict[str, dict]) -> dict:
    """The variant the others are compared with: 'baseline', else 'baseline@micro' (the equal
    split with micro-batches, where a worker's share passes its memory cap); {} without one."""
    return results.get("baseline") or results.get("baseline@micro") or {}


SAME_LOSS_RTOL = 1e-5  # the variants' gradients are equal, summed in another order


def with_time_to_target(results: dict[str, dict]) -> dict[str, dict]:
    """Each variant's training time until its first evaluation that met the figure baseline
    ended at (val_loss at most, or accuracy at least: `time_to_baseline_final_s`, None if it
    never did) and baseline's time over it (`time_to_target_speedup`); the same from the start
    of each variant's job, its profile and launch included (`end_to_end_time_to_baseline_final_s`,
    `end_to_end_time_to_target_speedup`) (pure). A val_loss
    within `SAME_LOSS_RTOL` of the target meets it: other local batches sum the same gradients
    in another order (3.0702174 against 3.0702152 on the default gpt)."""
    base = baseline_of(results).get("evals")
    if not base:
        return results
    key = "val_loss" if "val_loss" in base[-1] else "accuracy"
    target = base[-1][key]

    def met(e: dict) -> bool:
        if key == "val_loss":
            return e[key] <= target * (1 + SAME_LOSS_RTOL)
        return e[key] >= target

    base_time = next(e["train_time_s"] for e in base if met(e))
    base_e2e = _end_to_end_at(baseline_of(results), next(e for e in base if met(e)))
    for r in results.values():
        e = next((e for e in r.get("evals", []) if met(e)), None)
        hit = e["train_time_s"] if e else None
        r["time_to_baseline_final_s"] = hit
        r["time_to_target_speedup"] = base_time / hit if hit else None
        e2e = _end_to_end_at(r, e) if e else None
        r["end_to_end_time_to_baseline_final_s"] = e2e
        r["end_to_end_time_to_target_speedup"] = base_e2e / e2e if base_e2e and e2e else None
    return results


def _end_to_end_at(run: dict, e: dict) -> float | None:
    """Seconds from the start of `run`'s job (its profile, if it paid one) to evaluation `e`,
    where the run recorded when `e` was."""
    if e.get("wall_s") is None:
        return None
    return (run.get("profiling_time_s") or 0.0) + e["wall_s"]
