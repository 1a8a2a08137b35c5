"""The re-balancer's turn in the training loop: when it looks at the steps, what it is fed,
and when its proposal comes in."""

from __future__ import annotations

from hetflow.config import TrainConfig
from hetflow.records import StepRecord
from hetflow.training.loop.state import LoopState
from hetflow.training.loop.step_times import column_means, step_spread
from hetflow.training.plan.rebalancer import SUDDEN_STEPS, Rebalancer


def rebalance(
    rebalancer: Rebalancer, state: LoopState, cfg: TrainConfig, step: int, flush: bool, last: bool
) -> None:
    """Feed `rebalancer` after a sudden change (dynamic schedule), a full window
    (`Rebalancer.window_rows`: short while it learns), or a flush, with the window's step
    spread; the dynamic schedule then adopts its proposal from the next step (not after the
    last). Every rank calls it with the same rows and reaches the same plan."""
    dynamic = cfg.schedule == "dynamic"
    sudden = dynamic and rebalancer.sudden_change(state.current, state.plan)
    window, rows = state.window, rebalancer.window_rows(cfg.rebalance_every)
    if not (sudden or (window and (len(window) >= rows or flush))):
        return
    # After a sudden change only the steps since it tell the new speeds.
    seen = state.current[-SUDDEN_STEPS:] if sudden else window
    rebalancer.observe(state.plan, column_means(seen), step_spread(seen, state.plan), len(seen))
    state.window = []
    if sudden:
        state.current = []
    if dynamic and not last:
        switch = switch_s(state.records)
        new = rebalancer.propose(state.plan, step + 1, cfg.steps - step - 1, switch)
        if new is not None:
            state.adopt(new, step + 1)


def switch_s(records: list[StepRecord]) -> float:
    """What bringing a rank back into the all-reduce costs once: its copy of the replica
    (`computing.sync_replicas`), about one gradient's all-reduce: the communication of this
    rank's latest steps."""
    return max((r.comm_s for r in records[-SUDDEN_STEPS:]), default=0.0)
