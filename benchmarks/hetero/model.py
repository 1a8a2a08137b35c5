"""How far `hetflow bench hetero`'s runs computed from the profile's model, and what that
leaves of each efficiency once the host's own pace is taken out (pure)."""

from __future__ import annotations

import statistics

from hetflow.training.metrics import THROUGHPUT_SKIP_STEPS
from hetflow.training.plan.balance import micro_cost


def compute_model_error(
    result: dict,
    plan: list[int],
    latency_s: list[float],
    per_sample_s: list[float],
    until_step: int,
    caps: list[int | None] | None = None,
) -> list[float | None]:
    """Per rank, measured compute per step over the plan's model a_i + c_i x b_i, minus 1;
    given `caps` (a plan with micro-batches), a_i once per micro-batch (`micro_cost`).

    Over the steps that ran the first plan's batch, leaving out step 0 (DDP's set-up) and every
    step from `until_step` on (a straggler changes the speeds there); None where no step did,
    and for a rank the plan left at batch 0 (it computes nothing to compare).
    """
    out: list[float | None] = []
    for r in sorted(result["ranks"], key=lambda r: r["rank"]):
        k = r["rank"]
        times = [
            x["compute_s"]
            for x in r["records"]
            if THROUGHPUT_SKIP_STEPS <= x["step"] < until_step and x["batch"] == plan[k]
        ]
        cap = caps[k] if caps else None
        predicted = micro_cost(latency_s[k], per_sample_s[k], plan[k], cap, caps is not None)
        ok = times and predicted > 0 and plan[k] > 0
        out.append(sum(times) / len(times) / predicted - 1 if ok else None)
    return out


def at_run_pace(efficiency: float, errors: list[float | None]) -> dict:
    """The run's figures with the host's pace during the run taken out of the ideal.

    The ideal is planned from the profile, measured seconds to minutes before the run; the host
    (2 shared cores here) computes the same batch up to 31% faster or slower from one moment to
    the next (docs/measurements/host.md), and every emulated worker moves with
    it. `host_pace` is the median rank's measured over predicted compute (`errors`, from
    `compute_model_error`): how much slower than profiled this host ran during the run, whatever
    the plan. Scaling every worker's a_i and c_i by it scales the balanced step by it and keeps
    every choice of the plan (which workers compute), so the ideal at the run's pace is the
    profile's over `host_pace`, and `efficiency_at_run_pace` is `efficiency` x `host_pace`.
    `compute_model_error_at_run_pace` is each rank's error over that median: how far the profile
    had the workers' speeds relative to each other wrong, which is what a plan depends on. A
    median: one rank the plan put where its model fails does not move it; a plan that put most
    ranks there would read as pace, and shows in the spread. Nones (ranks left out) are skipped;
    with no rank measured, every figure is None.
    """
    known = [e for e in errors if e is not None]
    if not known:
        return {
            "host_pace": None,
            "efficiency_at_run_pace": None,
            "compute_model_error_at_run_pace": [None] * len(errors),
        }
    pace = 1 + statistics.median(known)
    return {
        "host_pace": pace,
        "efficiency_at_run_pace": efficiency * pace,
        "compute_model_error_at_run_pace": [
            None if e is None else (1 + e) / pace - 1 for e in errors
        ],
    }


def steps_to_final_rate(result: dict, within: float = 0.05) -> int | None:
    """The step from which the run first ran a plan within `within` of its final plan's mean
    step, or the final plan itself (rank 0's step times, each plan's first two steps and step
    0 left out; the same plan's segments can differ by the host's noise alone): 0 for a run
    whose first plan did; None where a plan has no step to measure.

    >>> recs = [{"step": s, "step_s": 0.2 if s < 20 else 0.1} for s in range(100)]
    >>> plans = [{"step": 0, "plan": [1]}, {"step": 20, "plan": [2]}]
    >>> steps_to_final_rate({"ranks": [{"rank": 0, "records": recs, "plans": plans}]})
    20
    """
    lead = min(result["ranks"], key=lambda r: r["rank"])
    starts = [p["step"] for p in lead["plans"]]
    ends = [*starts[1:], None]
    means = []
    for start, end in zip(starts, ends, strict=True):
        times = [
            x["step_s"]
            for x in lead["records"]
            if x["step"] >= max(start + 2, 1) and (end is None or x["step"] < end)
        ]
        if not times:
            return None
        means.append(statistics.fmean(times))
    final = lead["plans"][-1]["plan"]
    for p, mean in zip(lead["plans"], means, strict=True):
        if p["plan"] == final or mean <= means[-1] * (1 + within):
            return p["step"]
    return starts[-1]
