"""Who won a comparison, in one plain sentence, and after how many steps the optimized run
paid for what it spent before its steps (pure)."""

from __future__ import annotations

import math


def _get(m: dict, name: str) -> float:
    v = m.get(name)
    return float(v) if v is not None and math.isfinite(float(v)) else 0.0


def upfront_s(m: dict) -> float:
    """What a run spent before its steps: its profile, launch and 'auto''s trials."""
    return _get(m, "profiling_time_s") + _get(m, "startup_s")


def pays_after(baseline: dict, optimized: dict) -> int | None:
    """The steps after which the optimized run's faster steps have paid for what it spent
    before them beyond the baseline (`upfront_s`); 0 when it spent no more and its steps were
    no slower (or their count is unknown); None when its steps are slower, or no faster while
    it spent more: a run whose steps lost time has not paid for itself, however little it
    spent before them.

    >>> b = {"startup_s": 10.0, "train_loop_s": 20.0, "steps": 100}
    >>> pays_after(b, {"startup_s": 13.0, "train_loop_s": 10.0, "steps": 100})
    30
    >>> pays_after(b, {"startup_s": 9.0, "train_loop_s": 10.0, "steps": 100})
    0
    >>> pays_after(b, {"startup_s": 5.0, "train_loop_s": 26.0, "steps": 100}) is None
    True
    """
    extra = upfront_s(optimized) - upfront_s(baseline)
    steps_b, steps_o = _get(baseline, "steps"), _get(optimized, "steps")
    if not steps_b or not steps_o:
        return 0 if extra <= 0 else None
    saved = _get(baseline, "train_loop_s") / steps_b - _get(optimized, "train_loop_s") / steps_o
    if extra <= 0:
        return 0 if saved >= 0 else None
    return math.ceil(extra / saved) if saved > 0 else None


def verdict(baseline: dict, optimized: dict) -> str:
    """One sentence: end to end (to the target where both reached it, else the whole run),
    how much faster or slower the optimized run was, what its steps saved against what it
    spent before them, and after how many steps it paid for itself.

    >>> b = {"end_to_end_s": 40.0, "startup_s": 10.0, "train_loop_s": 30.0, "steps": 100}
    >>> o = {"end_to_end_s": 30.0, "startup_s": 12.0, "train_loop_s": 18.0, "steps": 100}
    >>> verdict(b, o)  # doctest: +NORMALIZE_WHITESPACE
    'End to end, optimized finished the run 1.33x faster (30.0 s against 40.0 s): its faster
    steps saved 12.0 s, more than the 2.0 s more it spent before them (profile, launch,
    trials); it paid for itself after 17 steps.'
    """
    target = "end_to_end_time_to_target_s"
    key = target if baseline.get(target) and optimized.get(target) else "end_to_end_s"
    t_b, t_o = _get(baseline, key), _get(optimized, key)
    if not t_b or not t_o:
        return ""
    what = "reached the target" if key == target else "finished the run"
    extra = upfront_s(optimized) - upfront_s(baseline)
    saved = (t_b - upfront_s(baseline)) - (t_o - upfront_s(optimized))
    faster = t_o < t_b
    ratio = t_b / t_o if faster else t_o / t_b
    head = (
        f"End to end, optimized {what} {ratio:.2f}x {'faster' if faster else 'slower'} "
        f"({t_o:.1f} s against {t_b:.1f} s): "
    )
    before = "(profile, launch, trials)"
    if extra <= 0:
        verb = "saved" if saved >= 0 else "lost"
        body = f"it spent no more before its steps, and its steps {verb} {abs(saved):.1f} s"
    elif faster:
        body = (
            f"its faster steps saved {saved:.1f} s, more than the {extra:.1f} s more it spent "
            f"before them {before}"
        )
    else:
        body = (
            f"the {extra:.1f} s more it spent before its steps {before} cost more than its "
            f"steps saved ({saved:.1f} s)"
        )
    n = pays_after(baseline, optimized)
    tail = (
        "it paid for itself from its first step"
        if n == 0
        else f"it paid for itself after {n} steps"
        if n is not None
        else "its steps were no faster"
    )
    return f"{head}{body}; {tail}."
