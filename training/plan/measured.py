"""The plans a run measured, and the verdict on a plan on trial (pure): the rule that decides
from measured windows, apart from the model that proposes (`rebalancer`) and the loop that
acts (`loop.rebalancing`), as AdaptDL keeps its goodput model apart from its decisions.

Each plan measured since the speeds last changed is one `tried` entry (a dict, so that a
checkpoint keeps it as JSON): its mean step (`step_s`, the newest window weighing `smoothing`),
the spread of its newest window's steps (`noise`) over `rows` of them, how far its windows'
means moved from one to the next (`between`, relative, smoothed: the noise of a window's mean
where slow stretches make the steps not independent) and how many windows it holds.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Literal

# A new plan is kept as soon as its measured step is shorter than the plan's before it by more
# than this many standard errors of their difference (one-sided, about 95%), given up as soon
# as it is longer by as much, and given up after TRIAL_WINDOWS windows within the noise.
KEEP_Z = 1.64
TRIAL_WINDOWS = 4
# How much more than its margin a re-plan must gain to bring back a rank the plan left out.
BRING_BACK = 2.0


def gain_bar(
    margin: float,
    rejected: int,
    plan: Sequence[int],
    new: Sequence[int],
    after: float,
    steps_left: int | None,
    switch_s: float,
) -> float:
    """The predicted gain `new` must beat over `plan`: `margin`, twice it where a rank comes
    back plus its copy (`switch_s`) spread over the `steps_left` at `new`'s step (`after`),
    and doubled for each of the `rejected` plans given up since the speeds changed (the model
    was wrong there, and a trial costs windows on a plan that may be slower), up to 8x.

    >>> gain_bar(0.1, 0, [8, 8], [4, 12], 1.0, 10, 5.0)
    0.1
    >>> gain_bar(0.1, 1, [8, 0], [4, 4], 1.0, 10, 5.0)  # back, one given up: 0.1 x 2 x 2 + 0.5
    0.9
    """
    back = any(b == 0 and n > 0 for b, n in zip(plan, new, strict=True))
    bar = margin * (BRING_BACK if back else 1.0) * 2 ** min(rejected, 3)
    if back and steps_left and after > 0:
        bar += switch_s / (steps_left * after)
    return bar


def entry_of(tried: Sequence[dict], plan: Sequence[int] | None) -> dict | None:
    """The entry of `plan` among `tried`, None where it was not measured."""
    return next((t for t in tried if plan is not None and t["plan"] == list(plan)), None)


def window_se(noise: float, rows: int, entry: dict | None) -> float:
    """The relative standard error of a window's mean step: its steps' spread over the square
    root of their count, or, where the plan's windows differed more than that (slow stretches
    of several steps: the steps are not independent), that difference.

    >>> window_se(0.1, 4, None), window_se(0.1, 4, {"between": 0.08})
    (0.05, 0.08)
    """
    within = noise / math.sqrt(rows) if rows else 0.0
    return max(within, entry["between"] if entry else 0.0)


def best_of(tried: Sequence[dict], besides: Sequence[int] | None = None) -> list[int] | None:
    """The plan of shortest measured step among `tried` (not `besides`); None for none.

    >>> best_of([{"plan": [1], "step_s": 0.2}, {"plan": [2], "step_s": 0.1}], besides=[2])
    [1]
    """
    kept = [t for t in tried if besides is None or t["plan"] != list(besides)]
    return min(kept, key=lambda t: t["step_s"])["plan"] if kept else None


def recent(tried: Sequence[dict], window: int, within: int = 2 * TRIAL_WINDOWS) -> list[dict]:
    """The entries of `tried` measured within the last `within` windows before `window` (the
    run's count): under a drift an older measurement tells another speed.

    >>> [t["plan"] for t in recent([{"plan": [1], "at": 2}, {"plan": [2], "at": 9}], 12)]
    [[2]]
    """
    return [t for t in tried if window - t.get("at", window) <= within]


def record(
    tried: list[dict],
    plan: Sequence[int],
    step_s: float,
    noise: float,
    rows: int,
    w: float,
    at: int = 0,
) -> None:
    """One more window of `plan` into `tried` (the run's window `at`): its mean step `step_s`,
    weighing `w` against the plan's earlier windows; the change from them feeds `between`."""
    entry = entry_of(tried, plan)
    if entry is None:
        tried.append(
            {
                "plan": list(plan),
                "step_s": step_s,
                "rows": rows,
                "noise": noise,
                "between": 0.0,
                "windows": 1,
                "at": at,
            }
        )
        return
    entry["at"] = at
    moved = abs(math.log(step_s / entry["step_s"])) / math.sqrt(2) if entry["step_s"] else 0.0
    entry["between"] = moved if not entry["between"] else w * moved + (1 - w) * entry["between"]
    entry["step_s"] = w * step_s + (1 - w) * entry["step_s"]
    entry["rows"], entry["noise"] = rows, noise
    entry["windows"] = entry.get("windows", 1) + 1


def start_trial(
    plan: Sequence[int], new: Sequence[int], entry: dict | None, se: float, **extra
) -> dict:
    """A trial of `new` after `plan`, whose measured entry (None: its newest window alone,
    `extra["step_s"]`) and window noise `se` it is judged against; `extra` is kept (the
    model's prediction, for its error)."""
    before_se = se / math.sqrt(min(entry["windows"], 3)) if entry else se
    return {
        **extra,
        "plan": list(plan),
        "new": list(new),
        **({"step_s": entry["step_s"]} if entry else {}),
        "se": before_se,
    }


def judge(trial: dict, step_s: float, se: float) -> Literal["kept", "given up"] | None:
    """The verdict on `trial` after one more window of its plan (mean step `step_s`, window
    noise `se`): 'kept' once its windows' mean is shorter than the plan's before it beyond
    KEEP_Z standard errors of the difference, 'given up' once longer by as much or after
    TRIAL_WINDOWS windows that do not show it shorter; None: measure on.
    Updates the trial's `windows` and `after_s` (the mean of its windows).

    >>> t = {"plan": [64, 64], "new": [80, 48], "step_s": 0.1, "se": 0.01}
    >>> judge(t, 0.08, 0.01), judge({**t, "windows": 0}, 0.099, 0.01)
    ('kept', None)
    """
    trial["windows"] = n = trial.get("windows", 0) + 1
    trial["after_s"] = step_s if n == 1 else ((n - 1) * trial["after_s"] + step_s) / n
    after, before = trial["after_s"], trial["step_s"]
    bar = KEEP_Z * math.hypot(se / math.sqrt(n), trial["se"])
    last = n >= TRIAL_WINDOWS
    if after < before * (1 - bar):
        return "kept"
    if after > before * (1 + bar) or last:
        return "given up"
    return None


def return_to(
    tried: Sequence[dict], window: int, plan: Sequence[int], after_s: float
) -> list[int] | None:
    """Where a run goes when the trial of `plan` is given up at its `window`: the plan of
    shortest step measured within the last windows (`recent`), the trial's own (`after_s`, the
    mean of its windows) among them; None where that is the trial's: no plan measured lately
    is better, so it stays.

    >>> tried = [{"plan": [1], "step_s": 0.2, "at": 9}, {"plan": [2], "step_s": 0.3, "at": 10}]
    >>> return_to(tried, 10, [2], 0.25), return_to(tried, 10, [2], 0.15)
    ([1], None)
    """
    others = [t for t in recent(tried, window) if t["plan"] != list(plan)]
    best = best_of([*others, {"plan": list(plan), "step_s": after_s}])
    return None if best == list(plan) else best
