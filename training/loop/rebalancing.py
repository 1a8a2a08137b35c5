"""The training loop's re-balancer: the `Rebalancer` it starts from the plan (`new_rebalancer`),
and its turn after each step (`Rebalancing.after`): every rank's step times shared, when it
looks at the steps, what it is fed, and when its proposal comes in."""

from __future__ import annotations

from hetflow.config import TrainConfig
from hetflow.records import StepRecord
from hetflow.training.launch.spec import RunSpec
from hetflow.training.loop.compute_times import (
    SharedStepTimes,
    column_means,
    mean_step,
    step_spread,
)
from hetflow.training.loop.state import LoopState
from hetflow.training.plan.rebalancer import SUDDEN_STEPS, Rebalancer
from hetflow.training.plan.rounds import loop_counts


class Rebalancing:
    """The run's re-balancer (`rebalancer`, saved and resumed by the checkpointer) and the
    step times it is fed from (`shared`: `SharedStepTimes`, whose group the trials share and
    which a rank left out of the all-reduce posts to in its step). Every rank calls `after`
    with the same arguments after every step: it issues the same collectives and reaches the
    same plan."""

    def __init__(self, spec: RunSpec, world: int, shared: SharedStepTimes) -> None:
        self.cfg = spec.train
        self.shared = shared
        self.rebalancer = new_rebalancer(spec, world)

    def after(
        self, rec: StepRecord, state: LoopState, flush: bool, last: bool, posted: bool
    ) -> None:
        """The turn after `rec`'s step: its time shared (`share`), then the re-balancer's
        (`rebalance`); `flush` (a checkpoint or the run's end comes next) waits for every
        step's times; `last`: the run's last step."""
        self.share(rec, state, flush, posted)
        rebalance(self.rebalancer, state, self.cfg, rec.step, flush, last)

    def share(self, rec: StepRecord, state: LoopState, flush: bool, posted: bool) -> None:
        """Post this step's compute time, tagged with the plan it ran (unless `posted`
        already), and keep the rows that have come in (all of them when `flush`)."""
        if not posted:
            self.shared.post(rec, len(state.plans))
        for done, tag, row in self.shared.collect(flush=flush):
            state.add_row(tag, done.step, row)


def share_every(cfg: TrainConfig) -> int:
    """How many steps' times go out together (`SharedStepTimes`): every step's under the
    dynamic schedule, else `rebalance_every`'s."""
    return 1 if cfg.schedule == "dynamic" else cfg.rebalance_every


def new_rebalancer(spec: RunSpec, world: int) -> Rebalancer:
    """A re-balancer that starts from the plan's step model and memory caps (measured, or
    declared where lower)."""
    cfg, plan = spec.train, spec.plan
    caps = list(plan.caps) or [w.memory_cap_batch for w in spec.cluster.workers]
    latency = list(plan.latency_s) or [0.0] * world
    return Rebalancer(
        loop_counts(cfg).global_batch,
        caps,
        latency,
        list(plan.per_sample_s) or None,
        threshold=cfg.rebalance_threshold,
        micro=cfg.accumulate == "auto",
    )


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
    rebalancer.observe(
        state.plan,
        column_means(seen),
        step_spread(seen, state.plan),
        len(seen),
        mean_step(seen, state.plan),
        seen,
    )
    state.window = []
    if sudden:
        state.current = []
    if dynamic and not last:
        switch = switch_s(state.records)
        new = rebalancer.propose(state.plan, step + 1, loop_counts(cfg).steps - step - 1, switch)
        if new is not None:
            state.adopt(new, step + 1)


def switch_s(records: list[StepRecord]) -> float:
    """What bringing a rank back into the all-reduce costs once: its copy of the replica
    (`computing.sync_replicas`), about one gradient's all-reduce: the communication of this
    rank's latest steps."""
    return max((r.comm_s for r in records[-SUDDEN_STEPS:]), default=0.0)
