"""A worker lost in place (killed, stalled) under `faults.on_loss: continue` leaves no result of
its own: its stretch, the steps it ran, is rebuilt by the ranks left from what they already
hold (`LostStretches`), and kept in the job's store (`lost/I`), where the rank that writes the
run's result finds it (`lost_results`, `RunResult.lost`).

Built from what the survivors hold, not from a result each rank publishes as it goes (at each
checkpoint, say): every rank's compute time of every step already reaches every rank
(`loop.compute_times.SharedStepTimes`), and the batch each ran is the plan in force, which
every rank holds alike; those are what the profile history's entry of its type needs
(`plan.learned.compute_points`: batch, compute time, micro-batches) and what the per-rank
timeline draws. Kept, they cost a dict entry per step and nothing on the wire while nothing
fails; a published result would cost its bytes at every checkpoint and still lack the steps
after the last one. What it lacks: the steps whose times were still on their way when the
rank was lost (at most one sharing interval's, `rebalancing.share_every`: one step under the
dynamic schedule), and what only the lost process measured: its data wait, communication,
loss and bytes (0 in its records). Its node is the survivors' (the elastic launcher runs
every rank on its own machine)."""

from __future__ import annotations

from collections.abc import Sequence

from hetflow.records import MembershipChange, PlanChange, RankResult, StepRecord
from hetflow.training.elastic.departure import store_result, stored_results
from hetflow.training.launch.spec import node_id
from hetflow.training.loop.micro import micro_count


def plan_at(plans: Sequence[PlanChange], step: int) -> list[int]:
    """The local batches in force at `step`: the last plan adopted from that step or before.

    >>> plans = [PlanChange(step=0, plan=[8, 8]), PlanChange(step=5, plan=[4, 12])]
    >>> plan_at(plans, 4), plan_at(plans, 5)
    ([8, 8], [4, 12])
    """
    return [p for p in plans if p.step <= step][-1].plan


def lost_records(
    rank: int,
    rows: dict[int, list[float]],
    plans: Sequence[PlanChange],
    since: int = 0,
    cap: int | None = None,
) -> list[StepRecord]:
    """Rank `rank`'s steps from `since` on, as the shared rows (`rows`: step -> every rank's
    compute time) hold them, once each, in order: its batch under the plan in force
    (`plans`), run as micro-batches under `cap` (`train.accumulate: auto`), its compute time
    (its column), its idle time (the step's slowest compute less its own), the step the two;
    its data wait, communication, loss and bytes are not known to the others: 0.

    >>> recs = lost_records(1, {0: [0.2, 0.1], 1: [0.2, 0.3]}, [PlanChange(step=0, plan=[8, 4])])
    >>> [(r.step, r.batch, r.compute_s, r.idle_s, r.step_s) for r in recs]
    [(0, 4, 0.1, 0.1, 0.2), (1, 4, 0.3, 0.0, 0.3)]
    """
    out = []
    for step in sorted(s for s in rows if s >= since):
        row = rows[step]
        batch, compute = plan_at(plans, step)[rank], row[rank]
        idle = max(row) - compute
        out.append(
            StepRecord(
                step=step,
                batch=batch,
                data_s=0.0,
                compute_s=compute,
                wait_s=idle,
                step_s=compute + idle,
                loss_sum=0.0,
                bytes_sent=0.0,
                idle_s=idle,
                micro_batches=micro_count(batch, cap),
            )
        )
    return out


class LostStretches:
    """A member's record of what it needs to rebuild a lost peer's stretch: the shared rows
    (`SharedStepTimes.kept`, from here on, for the whole run), each member's first step
    (`since`: the loop's start, or the step it joined at) and the worker it runs as
    (`names`: as its generation recorded it, before a replacement takes its slot).

    Every member keeps them, so that whichever is the leader after a loss (the lowest rank
    left, where rank 0 was lost) rebuilds the lost ranks' stretches (`publish`)."""

    def __init__(self, world, shared, start: int, caps: list | None) -> None:
        self.rows: dict[int, list[float]] = {}
        shared.kept = self.rows
        self.since = {m: start for m in world.members}
        self.names = {m: world.worker_of(m) for m in world.members}
        self.caps = caps  # each slot's largest micro-batch (`loop.micro.micro_caps`), or None

    def follow(self, change: MembershipChange) -> None:
        """A new generation: the ranks that joined start at its step, under their names."""
        for j in change.joined:
            self.since[j] = change.step
        self.names |= change.workers

    def stretch(self, rank: int, plans: Sequence[PlanChange], params: int) -> RankResult:
        """Lost rank `rank`'s result as this member holds it (`lost_records`), with the plans
        it holds, `params` the model's parameters (every rank's are the same)."""
        cap = self.caps[rank] if self.caps is not None else None
        records = lost_records(rank, self.rows, plans, self.since.get(rank, 0), cap)
        return RankResult(
            rank=rank,
            node=node_id(),
            worker=self.names.get(rank, ""),
            records=records,
            plans=list(plans),
            params=params,
        )

    def publish(self, store, lost: Sequence[int], plans: Sequence[PlanChange], params: int):
        """The stretches of the ranks `lost` (those that ran a step this member saw) in the
        job's `store` (`lost/I`), for the rank that writes the result; returns them."""
        out = [self.stretch(r, plans, params) for r in lost]
        out = [r for r in out if r.records]
        for r in out:
            store_result(store, "lost", r.model_dump_json())
        return out


def lost_results(store=None) -> list[str]:
    """The stretches (JSON) of the ranks lost in place, as their leaders left them in the
    job's `store` (a `world.PREFIX` one; by default this process's `ElasticWorld`'s), in the
    order they were lost; none outside `on_loss: continue`."""
    return stored_results("lost", store)
