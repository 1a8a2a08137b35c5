"""`hetflow bench comm`'s figures (pure): what one run measured, one method over `--repeat`
runs, and every method against `none`. The keys are those of the benchmark's JSON (the module
docstring of `benchmarks.comm` says what each one means)."""

from __future__ import annotations

from hetflow.repeats import with_medians
from hetflow.training.comm import ring_allreduce_bytes


def method_metrics(result: dict, global_batch: int, skip: int) -> dict:
    """The per-method figures from one run's result.json (pure)."""
    ranks = sorted(result["ranks"], key=lambda r: r["rank"])
    lead = ranks[0]["records"]
    steady = lead[skip:] or lead[1:] or lead
    n = len(steady)

    def mean(key: str, recs=steady) -> float:
        return sum(r[key] for r in recs) / len(recs)

    per_rank_steady = [sum(r["bytes_sent"] for r in rk["records"][skip:]) / n for rk in ranks]
    per_rank_run = [
        sum(r["bytes_sent"] for r in rk["records"]) / len(rk["records"]) for rk in ranks
    ]
    last = len(lead) - 1
    counts = [rk["records"][last].get("count") for rk in ranks]
    over = global_batch if None in counts else max(sum(counts), 1)
    final_loss = sum(rk["records"][last]["loss_sum"] for rk in ranks) / over
    evals = ranks[0]["evals"]
    return {
        "bytes_per_step": sum(per_rank_steady) / len(ranks),
        "run_bytes_per_step": sum(per_rank_run) / len(ranks),
        "step_time_s": mean("step_s"),
        "compute_time_s": mean("compute_s"),
        "comm_time_s": mean("comm_s"),
        "idle_time_s": mean("idle_s"),
        "final_loss": final_loss,
        "final_accuracy": evals[-1].get("accuracy") if evals else None,
        "final_val_loss": evals[-1].get("val_loss") if evals else None,
        "params": ranks[0]["params"],
        "steps": len(lead),
        "timed_steps": n,
    }


TIMES = ("step_time_s", "compute_time_s", "comm_time_s", "idle_time_s")


def combine_repeats(runs: list[dict]) -> dict:
    """One method's figures over `--repeat` runs (pure): each time is its own median, with
    `TIME_range` ([min, max]) beside it (`repeats.with_medians`), and `step_time_s_runs` keeps
    every run's step time. Bytes, loss and accuracy come from the first run; the same seed
    gives the same training in every run."""
    out = with_medians(runs[0], runs, TIMES)
    out["step_time_s_runs"] = [r["step_time_s"] for r in runs]
    out["wall_s"] = sum(r.get("wall_s", 0.0) for r in runs)
    return out


def paired_cuts(results: dict[str, dict], method: str) -> list[float]:
    """Step time saved by `method` against `none` in each round of runs (pure): rounds run every
    method back to back, so a slow spell of the host weighs on both sides of a pair."""
    if "none" not in results or method not in results:
        return []
    return [
        1 - m / n
        for m, n in zip(
            results[method]["step_time_s_runs"], results["none"]["step_time_s_runs"], strict=True
        )
    ]


def finish(results: dict[str, dict], none_bytes: float) -> None:
    """Ratios and accuracy deltas (or validation-loss ratios) against `none` (measured if it
    ran, else its formula)."""
    base = results.get("none")
    base_bytes = base["bytes_per_step"] if base else none_bytes
    for r in results.values():
        r["compression_ratio"] = (
            base_bytes / r["bytes_per_step"] if r["bytes_per_step"] else float("inf")
        )
        r["step_time_vs_none"] = r["step_time_s"] / base["step_time_s"] if base else None
        r["accuracy_delta_pp"] = r["val_loss_vs_none"] = None
        if base and r["final_accuracy"] is not None and base["final_accuracy"] is not None:
            r["accuracy_delta_pp"] = 100 * (r["final_accuracy"] - base["final_accuracy"])
        if base and r["final_val_loss"] is not None and base["final_val_loss"]:
            r["val_loss_vs_none"] = r["final_val_loss"] / base["final_val_loss"]


def quality(r: dict) -> str:
    """'accuracy A' for a classifier's figures, 'val_loss L' for a language model's."""
    if r.get("final_accuracy") is not None:
        return f"accuracy {r['final_accuracy']:.4f}"
    return f"val_loss {r.get('final_val_loss') or float('nan'):.4f}"


def method_results(rounds: dict[str, list[dict]], world: int) -> dict[str, dict]:
    """Every method's figures over its runs (`combine_repeats`), then against `none` (`finish`;
    without a `none` run, against the dense all-reduce of the model's float32 gradient among
    `world` ranks)."""
    results = {method: combine_repeats(rs) for method, rs in rounds.items()}
    params = next(iter(results.values()))["params"]
    finish(results, ring_allreduce_bytes(4 * params, world))
    return results
