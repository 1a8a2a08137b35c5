"""The heterogeneity scheduler: local batch sizes in proportion to measured speed (pure); the
step time they balance is the performance model's (`hetflow.perf.balance`).

>>> plan_batches([1, 1, 2, 4], 128)
[16, 16, 32, 64]
>>> plan_batches([1, 1, 2, 4], 128, caps=[None, None, None, 40])
[22, 22, 44, 40]
>>> balance_batches([0.04, 0.04, 0.02, 0.01], [0.4, 0.4, 0.2, 0.1], 128)
[11, 11, 32, 74]
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from hetflow.perf.balance import balanced_time, bracket
from hetflow.perf.curve import (
    Line,
    Micro,
    micro_cost,
    micro_share,
    micro_split,  # noqa: F401 (the model's, for the loop's micro)
)


class PlanError(ValueError):
    """Inputs no plan can satisfy; the message names the field."""


def _check(
    speeds: Sequence[float],
    global_batch: int,
    caps: Sequence[int | None],
    micro: bool = False,
) -> None:
    n = len(speeds)
    if n == 0:
        raise PlanError("speeds: at least one worker is needed")
    for i, s in enumerate(speeds):
        if not (isinstance(s, (int, float)) and math.isfinite(s) and s > 0):
            raise PlanError(f"speeds[{i}]: must be a finite number > 0 (got {s!r})")
    if global_batch < n:
        raise PlanError(f"global_batch: {global_batch} is smaller than the {n} workers")
    if len(caps) != n:
        raise PlanError(f"caps: {len(caps)} caps for {n} workers")
    for i, c in enumerate(caps):
        if c is not None and c < 1:
            raise PlanError(f"caps[{i}]: must be >= 1 (got {c})")
    if not micro and all(c is not None for c in caps) and sum(caps) < global_batch:
        raise PlanError(f"caps: they sum to {sum(caps)}, less than global_batch={global_batch}")


def plan_batches(
    speeds: Sequence[float], global_batch: int, caps: Sequence[int | None] | None = None
) -> list[int]:
    """Integer local batches b_i: sum b_i = global_batch, b_i ~ speed_i, 1 <= b_i <= cap_i.

    The continuous share is x_i = clip(lam * s_i, 1, cap_i) with lam chosen so that sum x_i =
    global_batch (water-filling); the integers are its floors plus the largest remainders.
    """
    caps = list(caps) if caps is not None else [None] * len(speeds)
    _check(speeds, global_batch, caps)
    return _apportion(lambda lam: [lam * s for s in speeds], speeds, global_batch, caps)


def balance_batches(
    per_sample_s: Sequence[float],
    latency_s: Sequence[float],
    global_batch: int,
    caps: Sequence[int | None] | None = None,
    micro: bool = False,
) -> list[int]:
    """Local batches that equalize predicted compute times a_i + c_i * b_i across ranks.

    With every latency a_i = 0 this is `plan_batches` with speeds 1 / c_i. A per-step fixed
    cost matters on slow devices, where it is paid at the device's pace: sizing by throughput
    at one batch size alone would starve them, step after step.

    `micro`: a rank's share may pass its cap, run as micro-batches (`micro_split`) that each pay
    a_i (`micro_cost`), so a rank gets more than its cap only where that shortens the step.

    >>> balance_batches([1e-3, 1e-4], [0.01, 0.01], 128, [None, 16])
    [112, 16]
    >>> balance_batches([1e-3, 1e-4], [0.01, 0.01], 128, [None, 16], micro=True)  # 5 x 16
    [48, 80]
    """
    caps = list(caps) if caps is not None else [None] * len(per_sample_s)
    speeds = [1.0 / c if c > 0 else math.inf for c in per_sample_s]
    _check(speeds, global_batch, caps, micro)
    lat = [max(0.0, a) for a in latency_s]
    if micro:
        return _apportion(
            lambda t: [micro_share(t, *r) for r in zip(lat, per_sample_s, caps, strict=True)],
            speeds,
            global_batch,
            [None] * len(caps),
            cost=lambda i, b: micro_cost(lat[i], per_sample_s[i], b, caps[i], True),
        )
    return _apportion(
        lambda t: [(t - a) / c for a, c in zip(lat, per_sample_s, strict=True)],
        speeds,
        global_batch,
        caps,
        cost=lambda i, b: lat[i] + per_sample_s[i] * b,
    )


def _apportion(
    shares, speeds: Sequence[float], global_batch: int, caps: list[int | None], cost=None
) -> list[int]:
    """Integers from continuous shares(lam), monotone in lam: clip to [1, cap], sum to B.

    The rounding difference goes by largest remainder, or, given `cost(i, b)` (a rank's step
    time at batch b), one sample at a time to the rank whose step stays shortest, which keeps
    the slowest step minimal.
    """
    hi_caps = [float(c) if c is not None else math.inf for c in caps]

    def clipped(lam: float) -> list[float]:
        return [min(hc, max(1.0, v)) for v, hc in zip(shares(lam), hi_caps, strict=True)]

    _, hi = bracket(lambda lam: sum(clipped(lam)), global_batch, 1.0, iterations=200)
    x = clipped(hi)
    b = [
        max(1, min(math.floor(v + 1e-9), int(min(hc, global_batch))))
        for v, hc in zip(x, hi_caps, strict=True)
    ]
    if cost is not None:
        return _greedy_fill(b, global_batch, hi_caps, cost)
    # Hand out (or take back) the rounding difference by largest (smallest) remainder.
    order = sorted(range(len(b)), key=lambda i: (x[i] - b[i], speeds[i]), reverse=True)
    diff = global_batch - sum(b)
    while diff > 0:
        for i in order:
            if diff and b[i] < hi_caps[i]:
                b[i] += 1
                diff -= 1
    while diff < 0:
        for i in reversed(order):
            if diff and b[i] > 1:
                b[i] -= 1
                diff += 1
    return b


def _greedy_fill(b: list[int], global_batch: int, hi_caps: list[float], cost) -> list[int]:
    n = len(b)
    while sum(b) < global_batch:
        i = min((j for j in range(n) if b[j] < hi_caps[j]), key=lambda j: cost(j, b[j] + 1))
        b[i] += 1
    while sum(b) > global_batch:
        i = max((j for j in range(n) if b[j] > 1), key=lambda j: cost(j, b[j]))
        b[i] -= 1
    return b


def balanced_step_time(
    latency_s: Sequence[float],
    per_sample_s: Sequence[float],
    global_batch: int,
    caps: Sequence[int | None] | None = None,
    micro: bool = False,
) -> float:
    """The step time T at which ranks computing a_i + c_i x b_i share `global_batch` with no
    rank waiting: sum_i clip((T - a_i) / c_i, 0, cap_i) = global_batch (continuous; inf when
    the caps cannot hold the batch). `micro`: no cap limits a share, each micro-batch pays a_i
    (`micro_share`). The model's solver (`hetflow.perf.balance.balanced_time`) on lines."""
    lines = [Line(a, c) for a, c in zip(latency_s, per_sample_s, strict=True)]
    if micro:
        caps = list(caps) if caps is not None else [None] * len(lines)
        return balanced_time(
            [Micro(line, cap) for line, cap in zip(lines, caps, strict=True)], global_batch
        )
    return balanced_time(lines, global_batch, caps)


# How far a rank's least step must pass the others' step before it is left out: over one
# coefficient of variation of a step (0.04 measured, docs/measurements/emulation.md), so that
# two workers of one speed are not split by noise (one left out, the other kept).
EXCLUDE_MARGIN = 0.05


def exclude_slow(
    latency_s: Sequence[float],
    per_sample_s: Sequence[float],
    global_batch: int,
    caps: Sequence[int | None] | None = None,
    names: Sequence[str] | None = None,
    min_batches: Sequence[int | None] | None = None,
    micro: bool = False,
) -> tuple[list[bool], list[str]]:
    """Which ranks take part in the synchronous step, and why each other one does not
    (`micro`: shares past the caps as micro-batches, `balanced_step_time`'s).

    A rank is left out when its least step is at least `EXCLUDE_MARGIN` over the step time the
    others reach sharing the whole global batch (`balanced_step_time`): any sample given to it
    would make the step longer than leaving it out, by more than the measurements' noise. Its
    least step is a_i + c_i, at the 1 sample an integer plan gives a rank at least (a_i alone
    keeps a rank that 1 sample makes the slowest), or, where
    `min_batches` gives the smallest batch b_i its step was measured at, a_i + c_i x b_i: below
    it the affine model is extrapolated and under-estimates a real step (a CPU worker beside a
    GPU, given 1 sample, measured 2-3x its predicted step). Greedy: the worst offender
    (largest least step / T_without_i) goes first, then the rule is applied again to the rest;
    one rank always stays, and a rank whose leaving would overflow the others' caps stays. A
    CPU worker beside a GPU, or a T4 beside many H100s, is the case this is for.

    >>> exclude_slow([0.01, 0.01, 0.5], [0.001, 0.001, 0.01], 64)[0]
    [True, True, False]
    >>> exclude_slow([0.01, 0.01, 0.02], [0.001, 0.001, 0.002], 64)[0]
    [True, True, True]
    >>> exclude_slow([0.01, 0.01, 0.0425], [0.001, 0.001, 0.003], 64)[0]  # 45.5 > 1.05 x 42 ms
    [True, True, False]
    >>> exclude_slow([0.01, 0.01, 0.0405], [0.001, 0.001, 0.003], 64)[0]  # 43.5 ms: within 5%
    [True, True, True]
    """
    n = len(latency_s)
    caps = list(caps) if caps is not None else [None] * n
    names = list(names) if names is not None else [f"rank {i}" for i in range(n)]
    floors = list(min_batches) if min_batches is not None else [None] * n
    least = [
        micro_cost(a, c, f or 1, cap, micro)
        for a, c, f, cap in zip(latency_s, per_sample_s, floors, caps, strict=True)
    ]
    included, why = [True] * n, []
    while sum(included) > 1:
        worst, worst_ratio, worst_t = None, 1.0 + EXCLUDE_MARGIN, 0.0
        for i in (i for i in range(n) if included[i]):
            rest = [j for j in range(n) if included[j] and j != i]
            t = balanced_step_time(
                [latency_s[j] for j in rest],
                [per_sample_s[j] for j in rest],
                global_batch,
                [caps[j] for j in rest],
                micro,
            )
            if math.isfinite(t) and least[i] >= t * worst_ratio:
                worst, worst_ratio, worst_t = i, least[i] / t, t
        if worst is None:
            break
        included[worst] = False
        why.append(_why_slow(names[worst], least[worst], floors[worst], worst_t))
    return included, why


def _why_slow(name: str, least: float, floor: int | None, others_s: float) -> str:
    """Why `exclude_slow` left a rank out: its least step against the others' step."""
    cost = (
        f"its step of {least:.3g} s at {floor} samples, the fewest it was measured at,"
        if floor
        else f"its step of {least:.3g} s at 1 sample, the least share it can take,"
    )
    return (
        f"{name}: {cost} is {least / others_s - 1:.0%} over the {others_s:.3g} s step the "
        "others take sharing the global batch"
    )


def balance_with_exclusion(
    per_sample_s: Sequence[float],
    latency_s: Sequence[float],
    global_batch: int,
    caps: Sequence[int | None] | None = None,
    names: Sequence[str] | None = None,
    min_batches: Sequence[int | None] | None = None,
    micro: bool = False,
) -> tuple[list[int], list[str]]:
    """`balance_batches` over the ranks `exclude_slow` keeps; 0 for the others, and why. A rank
    whose cap is 0 (its device holds no sample of the model) is left out first; a PlanError
    when every rank's is. `min_batches` and `micro`: as `exclude_slow` takes them."""
    n = len(per_sample_s)
    caps = list(caps) if caps is not None else [None] * n
    names = list(names) if names is not None else [f"rank {i}" for i in range(n)]
    able = [i for i in range(n) if caps[i] != 0]
    if not able:
        raise PlanError("caps: every rank's memory cap is 0: no rank holds a sample")
    keep, why = exclude_slow(
        [latency_s[i] for i in able],
        [per_sample_s[i] for i in able],
        global_batch,
        [caps[i] for i in able],
        [names[i] for i in able],
        [min_batches[i] for i in able] if min_batches is not None else None,
        micro,
    )
    why = [
        f"{names[i]}: its device holds no sample (memory cap 0)" for i in range(n) if caps[i] == 0
    ] + why
    idx = [i for i, k in zip(able, keep, strict=True) if k]
    return balance_among(per_sample_s, latency_s, global_batch, caps, idx, micro), why


def balance_among(
    per_sample_s: Sequence[float],
    latency_s: Sequence[float],
    global_batch: int,
    caps: Sequence[int | None],
    ranks: Sequence[int],
    micro: bool = False,
) -> list[int]:
    """`balance_batches` over `ranks` alone (`micro`: as it takes it); 0 for every other rank.

    >>> balance_among([1e-3, 1e-3, 1e-3], [0.0, 0.0, 0.0], 64, [None] * 3, [0, 2])
    [32, 0, 32]
    """
    part = balance_batches(
        [per_sample_s[i] for i in ranks],
        [latency_s[i] for i in ranks],
        global_batch,
        [caps[i] for i in ranks],
        micro,
    )
    batches = [0] * len(per_sample_s)
    for i, b in zip(ranks, part, strict=True):
        batches[i] = b
    return batches


def equal_batches(n: int, global_batch: int) -> list[int]:
    """The baseline split: as equal as integers allow."""
    return plan_batches([1.0] * n, global_batch)
