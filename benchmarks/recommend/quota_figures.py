"""The pure parts of `hetflow bench recommend --cpu-quotas`: the rule that gives each instance
type its CPU quota before anything runs, which mixes are run, and the figures that set each
mix's measured step, time and cost beside recommend's prediction (no I/O, no torch).

The quota rule (`quota_rule`) reads published figures only: a type's quota, in cores per GPU
worker, is `top_cores` times its GPU's published peak samples/s (the emulation presets',
NVIDIA's ResNet-50 v1.5 figures: `hetflow.emulation.presets`) over the fastest candidate GPU's,
rounded to 0.01 core and at least `QUOTA_MIN`. Nothing the predictor computes enters it, and
nothing measured: the workers' real speeds are then whatever the kernel's CFS quota makes of
the stand-in model on this host.
"""

from __future__ import annotations

import statistics
from collections.abc import Mapping, Sequence

# The kernel refuses a CFS quota under 1 ms, and `hetflow.training.cpu_quota` runs a 10 ms
# period: 0.1 core is the least quota a worker can be given.
QUOTA_MIN = 0.1


def quota_rule(peaks: Mapping[str, float], top_cores: float) -> dict[str, float]:
    """Each type's CPU quota per GPU worker: `top_cores` x its published peak samples/s
    (`peaks`, type -> samples/s of one of its GPUs) over the largest of `peaks`, rounded to
    0.01 core, at least QUOTA_MIN.

    >>> quota_rule({"g4dn.xlarge": 1562.0, "p3.2xlarge": 3363.0}, 0.5)
    {'g4dn.xlarge': 0.23, 'p3.2xlarge': 0.5}
    """
    if not top_cores >= QUOTA_MIN:
        raise ValueError(f"top_cores: at least {QUOTA_MIN} (got {top_cores!r})")
    top = max(peaks.values())
    return {name: max(QUOTA_MIN, round(top_cores * p / top, 2)) for name, p in peaks.items()}


def profile_batches(global_batch: int) -> list[int]:
    """The batches each type's profile times a step at: the powers of two from an eighth of
    the global batch to the global batch itself (at least 1), so that the fitted line spans
    the local batches the mixes run rather than being extrapolated to them (a worker under a
    CFS quota runs a step shorter than the quota's period at full speed, so small batches
    alone would read it as faster than its sustained pace).

    >>> profile_batches(512), profile_batches(100), profile_batches(2)
    ([64, 128, 256, 512], [8, 16, 32, 64], [1, 2])
    """
    top = 1 << (max(1, global_batch).bit_length() - 1)
    return sorted({max(1, top >> k) for k in range(4)})


def mixes_to_run(
    ranked: Sequence[tuple[int, ...]],
    singles: Sequence[tuple[int, ...]],
    gpus: Sequence[int],
    max_ranks: int,
    most: int,
) -> list[tuple[int, ...]]:
    """The mixes the check runs, as counts per candidate: recommend's choice (the first of
    `ranked`, its objective's order), the best mix of more than one type, and the best of each
    type alone (`singles`), then the next of `ranked`, each once, each of at most `max_ranks`
    GPUs (`gpus`: per instance of each candidate), `most` in all.

    >>> mixes_to_run([(2, 0), (1, 0), (2, 1), (0, 1)], [(2, 0), (0, 1)], [1, 1], 3, 3)
    [(2, 0), (2, 1), (0, 1)]
    """

    def ranks(counts: tuple[int, ...]) -> int:
        return sum(n * g for n, g in zip(counts, gpus, strict=True))

    fits = [c for c in ranked if 0 < ranks(c) <= max_ranks]
    mixed = [c for c in fits if sum(1 for n in c if n) > 1][:1]
    order = [*fits[:1], *mixed, *[s for s in singles if s in fits], *fits]
    out: list[tuple[int, ...]] = []
    for c in order:
        if c not in out and len(out) < most:
            out.append(c)
    return out


def relative_error(measured: float, predicted: float) -> float:
    """(measured - predicted) / measured: the share of the measured figure the prediction
    missed, signed (positive: the prediction was short)."""
    return (measured - predicted) / measured


def steady(values: Sequence[float], skip: int) -> float:
    """The median of `values` after the first `skip` (the warm-up); of all where none is left."""
    kept = list(values[skip:]) or list(values)
    return statistics.median(kept)


def worker_rows(
    names: Sequence[str],
    quotas: Sequence[float],
    kernel_quotas: Sequence[float | None],
    batches: Sequence[int],
    predicted_compute_s: Sequence[float],
    compute_records: Sequence[Sequence[float]],
    skip: int,
) -> list[dict]:
    """Per worker: the quota asked and the one the kernel enforced (read inside the rank), its
    local batch, its compute step as its curve predicts it at that batch, as measured (the
    median of its steps' compute after `skip`), and the error."""
    rows = []
    for name, q, kq, b, pred, recs in zip(
        names, quotas, kernel_quotas, batches, predicted_compute_s, compute_records, strict=True
    ):
        measured = steady(recs, skip)
        rows.append(
            {
                "worker": name,
                "cpu_quota": q,
                "kernel_cpu_quota": kq,
                "local_batch": b,
                "predicted_compute_s": pred,
                "measured_compute_s": measured,
                "compute_error": relative_error(measured, pred),
            }
        )
    return rows


def mix_row(
    predicted: Mapping[str, float],
    step_times: Sequence[float],
    skip: int,
    run_steps: int,
    job_steps: int,
    usd_per_hour: float,
    wall_s: float,
) -> dict:
    """One mix's measured figures beside recommend's prediction (`predicted`: `step_s` and
    `hours`, `cost_usd` for the job's `job_steps`): the steady step (the median of the lead
    rank's steps after `skip`), the training time of the `run_steps` steps run (the sum of its
    steps) against `run_steps` predicted steps, the wall clock with launch (which recommend
    does not price), the job's hours at the measured steady step and their cost at the mix's
    price, and the error of each."""
    step = steady(step_times, skip)
    train_s = sum(step_times)
    hours = step * job_steps / 3600
    cost = usd_per_hour * hours
    pred_train = predicted["step_s"] * run_steps
    return {
        "measured_step_s": step,
        "step_error": relative_error(step, predicted["step_s"]),
        "predicted_train_s": pred_train,
        "measured_train_s": train_s,
        "train_error": relative_error(train_s, pred_train),
        "measured_wall_s": wall_s,
        "wall_error": relative_error(wall_s, pred_train),
        "measured_hours": hours,
        "hours_error": relative_error(hours, predicted["hours"]),
        "measured_cost_usd": cost,
        "cost_error": relative_error(cost, predicted["cost_usd"]),
    }


def cpu_stat(text: str) -> dict[str, int]:
    """A cgroup's `cpu.stat` (v1 or v2: 'key value' lines) as numbers.

    >>> cpu_stat("nr_periods 10\\nnr_throttled 4\\n")["nr_throttled"]
    4
    """
    return {k: int(v) for k, v in (line.split() for line in text.splitlines() if line.strip())}


def throttled_share(samples: Sequence[tuple[float, int, int]]) -> float | None:
    """Of the CFS periods a worker's cgroup had work in during the later half of its job
    (`samples`: time, nr_periods, nr_throttled, read while it ran), the share in which it used
    up its quota: near 1, the quota was what bound it; well under 1, something else held it
    below its quota (other processes on the host, waiting on its peers). None: too few samples.

    >>> throttled_share([(0, 0, 0), (1, 100, 100), (2, 200, 190), (3, 300, 280)])
    0.9
    """
    if len(samples) < 2:
        return None
    middle = (samples[0][0] + samples[-1][0]) / 2
    later = [s for s in samples if s[0] >= middle] or samples[-2:]
    first, last = (later[0], later[-1]) if len(later) > 1 else (samples[-2], samples[-1])
    periods = last[1] - first[1]
    return (last[2] - first[2]) / periods if periods > 0 else None


def within(rows: Sequence[Mapping], keys: Sequence[str], goal: float) -> bool:
    """Whether every row's error under each of `keys` is within `goal` (a fraction)."""
    return all(abs(r[k]) <= goal for r in rows for k in keys)
