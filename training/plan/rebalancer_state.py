"""A re-balancer's checkpoint state (pure): what `Rebalancer.state` keeps, so that a resumed run
re-plans as the lost one would have, and how `Rebalancer.restore` reads it back; the one place
its keys are written. Keys a checkpoint of an older run lacks take their fresh values."""

from __future__ import annotations

from typing import Any

from hetflow.perf.curve import MOVE_FACTOR


def state_of(reb: Any) -> dict:
    """A `Rebalancer`'s state as plain JSON-able values."""
    return {
        "per_sample_s": reb.per_sample_s,
        "replans": reb.history,
        "points": None if reb.points is None else [sorted(p.items()) for p in reb.points],
        "latest": reb.latest,
        "rejected": reb.rejected,
        "trial": reb.trial,
        "revert_to": reb.revert_to,
        "errors": reb.errors,
        "noise": [reb.noise, reb.rows, reb.windows, reb.pending],
        "move": reb.move,
        "tried": reb.tried,
        "counts": [sorted(c.items()) for c in reb.counts],
        "spread": [reb.spread, reb.step_noise],
        "last_plan": reb.last_plan,
        "jumped": [reb.jumped, reb.relearn],
    }


def restore_from(reb: Any, state: dict) -> None:
    """Set a `Rebalancer` `reb` to what `state_of` kept."""
    reb.per_sample_s, reb.latest = state["per_sample_s"], state.get("latest")
    points = state.get("points")
    reb.points = (
        None
        if points is None or reb.latest is None
        else [{int(b): float(t) for b, t in p} for p in points]
    )
    reb.history, reb.rejected = state["replans"], state["rejected"]
    reb.trial, reb.revert_to = state["trial"], state["revert_to"]
    reb.errors = list(state.get("errors", []))
    reb.noise, reb.rows, reb.windows, reb.pending = state.get("noise", [0.0, 0, 0, None])
    reb.move = state.get("move", MOVE_FACTOR)
    reb.tried = list(state.get("tried", []))
    reb.counts = [{int(b): int(n) for b, n in c} for c in state.get("counts", [])]
    reb.spread, reb.step_noise = state.get("spread", [0.0, 0.0])
    reb.last_plan = state.get("last_plan")
    reb.jumped, reb.relearn = state.get("jumped", [False, 0])
