"""The pure parts of `hetflow bench recommend`: the naive choices, the emulated clock and link
that stand a job's devices in on this host, and the figures that compare measured with
predicted (no I/O, no torch).

The emulated clock (`device_seconds_per_emulated`). An emulated worker of preset p computes a
local batch b in `slowdown_p x cpu(b) x shape_p(b)` seconds (`hetflow.emulation.emulator`),
with `slowdown_p = time_scale x speed_f / speed_p` (f: the cluster's fastest worker, speed =
peak samples/s / 1000) and cpu(b) the host's CPU seconds for the stand-in recipe's step. The
prediction (`hetflow.forecast.rent.search.curve_for`) puts the same device's step at
`shape_p(b) x b x scale / peak_p`, scale = 3 x the job model's FLOPs per sample over
ResNet-50's. Where cpu(b) = c x b, their ratio is the same for every worker of the cluster:

    device seconds = emulated seconds x scale / (time_scale x peak_f x c)

c is the host's CPU seconds per sample of the stand-in, pooled over the cluster's local
batches (sum of cpu(b) over sum of b), as the run's own emulator dilated from (its shared
table of each batch's CPU time: `typical_settled`). The host's fixed cost per step (cpu(b) is
not quite c x b; `even_host_peaks` can cancel it) and whatever runs outside the emulated
compute phase (data, the optimizer step, Python) are not converted away: they are part of the
measured error.
"""

from __future__ import annotations

import statistics
from collections.abc import Mapping, Sequence

NAIVE = ("all-cheapest", "all-fastest", "equal-counts")


def naive_mixes(
    prices: Sequence[float], peaks: Sequence[float], available: Sequence[int]
) -> dict[str, tuple[int, ...]]:
    """The naive choices, as counts per candidate (in the candidates' order): every instance
    available of the type cheapest per hour, every instance of the type with the most peak
    samples/s per instance, and the same count of each type (the least availability)."""
    k = len(prices)
    cheap = min(range(k), key=lambda i: (prices[i], -peaks[i]))
    fast = max(range(k), key=lambda i: (peaks[i], -prices[i]))
    equal = min(available)
    return {
        "all-cheapest": tuple(available[i] if i == cheap else 0 for i in range(k)),
        "all-fastest": tuple(available[i] if i == fast else 0 for i in range(k)),
        "equal-counts": tuple(equal for _ in range(k)),
    }


def pooled_cpu_per_sample(cpu_s: Mapping[int, float], batches: Sequence[int]) -> float:
    """The host's CPU seconds per sample over a cluster's local batches: the sum of each
    worker's cpu(b) over the sum of b (workers with no sample left out)."""
    used = [b for b in batches if b > 0]
    return sum(cpu_s[b] for b in used) / sum(used)


def device_seconds_per_emulated(
    scale: float, time_scale: float, fastest_peak: float, cpu_per_sample: float
) -> float:
    """Device seconds one emulated second stands for (the module docstring's clock)."""
    return scale / (time_scale * fastest_peak * cpu_per_sample)


def link_for(comm_device_s: float, k: float, time_scale: float, sent_bytes: float) -> float | None:
    """The Gbit/s an emulated link (which costs time_scale x bytes / bandwidth) needs to carry
    the stand-in's `sent_bytes` a step in the emulated time of the job's predicted all-reduce
    (`comm_device_s / k`); None where nothing is predicted (one device)."""
    if comm_device_s <= 0 or sent_bytes <= 0:
        return None
    return time_scale * k * sent_bytes * 8 / (comm_device_s * 1e9)


def relative_error(measured: float, predicted: float) -> float:
    """(measured - predicted) / measured: the share of the measured figure the prediction
    missed, signed (positive: the prediction was short)."""
    return (measured - predicted) / measured


def measured_row(
    predicted: Mapping[str, float],
    emulated_step_s: float,
    k: float,
    steps: int,
    usd_per_hour: float,
) -> dict:
    """One choice's measured figures beside its predicted ones: the emulated step converted to
    device seconds (x k), hours for the job's `steps`, cost = price x measured hours (as
    recommend prices a mix), and the error of each."""
    step = emulated_step_s * k
    hours = step * steps / 3600
    cost = usd_per_hour * hours
    return {
        "measured_step_s": step,
        "measured_hours": hours,
        "measured_cost_usd": cost,
        "step_error": relative_error(step, predicted["step_s"]),
        "hours_error": relative_error(hours, predicted["hours"]),
        "cost_error": relative_error(cost, predicted["cost_usd"]),
    }


def versus_naive(rows: Mapping[str, Mapping], deadline_h: float | None) -> dict:
    """The recommended choice's measured cost against the cheapest naive choice whose measured
    hours meet the deadline (any, without one): its name, the saving (1 - recommended /
    naive), and whether the recommended one met the deadline itself."""
    rec = rows["recommended"]

    def meets(r: Mapping) -> bool:
        return deadline_h is None or r["measured_hours"] <= deadline_h

    naive = {n: r for n, r in rows.items() if n in NAIVE and meets(r)}
    out = {"recommended_meets_deadline": meets(rec), "best_naive": None, "saving": None}
    if naive:
        name = min(naive, key=lambda n: naive[n]["measured_cost_usd"])
        out["best_naive"] = name
        out["saving"] = 1 - rec["measured_cost_usd"] / naive[name]["measured_cost_usd"]
    return out


def typical_settled(records: Sequence[tuple[int, float]], world: int, keep: int) -> float:
    """The CPU time the emulator dilated a key's phases from, typically: the median over the
    run of the least of the last world x keep phases (`SharedCosts.settled`, per phase)."""
    window = world * keep
    cpus = [cpu for _, cpu in records]
    return statistics.median(min(cpus[max(0, i - window + 1) : i + 1]) for i in range(len(cpus)))


def phases(ranks: Sequence[Sequence[Mapping]], skip: int) -> dict[str, float]:
    """Where a run's step went, in emulated seconds, from each rank's step records after the
    first `skip`: the slowest rank's median compute phase (`compute_s`) and data wait
    (`data_s`), and the median step (`step_s`) of the rank whose median step is longest."""

    def median_of(key: str) -> float:
        return max(statistics.median(r[key] for r in recs[skip:]) for recs in ranks if recs)

    return {key: median_of(key) for key in ("compute_s", "data_s", "step_s")}


def even_host_peaks(
    peaks: Sequence[float], batches: Sequence[int], cpu_s: Mapping[int, float]
) -> list[float]:
    """`--even-host`: each worker's peak samples/s times its batch's CPU per sample on the host
    over the pooled one (`pooled_cpu_per_sample`), so that a worker whose batch costs the host
    more per sample is emulated that much faster and its emulated compute follows its preset
    curve on the pooled clock; unchanged where cpu(b) is c x b."""
    c = pooled_cpu_per_sample(cpu_s, batches)
    return [p * cpu_s[b] / b / c for p, b in zip(peaks, batches, strict=True)]
