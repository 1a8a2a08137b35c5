"""The global batch re-cut over a job's members when they change in place (`replan`), and the
step-time curve a worker that joins is planned with until its own steps teach it
(`joiner_curve`): the re-balancer's curves and balance (`plan.curves`), no formula of its own."""

from __future__ import annotations

import statistics

from hetflow.training.plan.balance import PlanError
from hetflow.training.plan.curves import balance_on_curves
from hetflow.training.plan.rebalancer import Rebalancer


def replan(
    rebalancer: Rebalancer, plan: list[int], members, global_batch: int, launch=None
) -> list[int]:
    """The global batch re-cut over `members`: on the re-balancer's learned curves where it
    has them (`balance_on_curves`, the others' caps 0), else in proportion to the shares the
    members had, a member that had none (a joiner) its share of the `launch` plan (a `Plan`).

    >>> from hetflow.training.plan.rebalancer import Rebalancer
    >>> replan(Rebalancer(64, [None] * 4, [0.0] * 4), [8, 8, 16, 32], (0, 2, 3), 64)
    [9, 0, 18, 37]
    """
    caps = [c if r in members else 0 for r, c in enumerate(rebalancer.caps)]
    if rebalancer.per_sample_s is not None:
        try:
            new, _ = balance_on_curves(
                rebalancer.curves(),
                global_batch,
                caps,
                micro=rebalancer.micro,
                move=rebalancer.move,
            )
            return new
        except PlanError:
            pass
    first = list(launch.local_batches) if launch is not None else [0] * len(plan)
    weights = [(plan[r] or first[r]) if r in members else 0 for r in range(len(plan))]
    if not sum(weights):
        weights = [int(r in members) for r in range(len(plan))]
    return apportion(weights, global_batch)


def apportion(weights: list[int], total: int) -> list[int]:
    """`total` split in proportion to `weights` by largest remainders (ties: lower index).

    >>> apportion([8, 0, 16, 32], 64)
    [9, 0, 18, 37]
    """
    s = sum(weights)
    exact = [w * total / s for w in weights]
    out = [int(x) for x in exact]
    order = sorted(range(len(weights)), key=lambda i: (out[i] - exact[i], i))
    for i in order[: total - sum(out)]:
        out[i] += 1
    return out


def joiner_curve(rebalancer: Rebalancer, joiner: int, members, spec) -> None:
    """Rank `joiner`'s step-time line in `rebalancer`, where none of its own steps measured it
    (no points): a member's of the same worker type (`instance_type` or `preset`), learned
    here; else the launch plan's prior for it (the history's or the published one), put in
    the members' measured units by the median ratio of their learned to their prior pace;
    else the members' median (the equal split's assumption). The same on every member: it
    reads only what `resync` made equal. Learned from its own steps from then on, like any
    other."""
    per, lat = rebalancer.per_sample_s, rebalancer.latency_s
    points = rebalancer.points
    if per is None or (points is not None and points[joiner]):
        return
    others = [m for m in members if m != joiner]
    if not others:
        return
    workers = spec.cluster.workers
    kind = _kind(workers[joiner])
    same = [m for m in others if kind is not None and _kind(workers[m]) == kind]
    prior = list(spec.plan.per_sample_s) if spec.plan is not None else []
    if same:
        per[joiner], lat[joiner] = per[same[0]], lat[same[0]]
        return
    lat[joiner] = statistics.median(lat[m] for m in others)
    if prior and all(prior[m] > 0 for m in others) and prior[joiner] > 0:
        scale = statistics.median(per[m] / prior[m] for m in others)
        per[joiner] = prior[joiner] * scale
    else:
        per[joiner] = statistics.median(per[m] for m in others)


def _kind(worker) -> str | None:
    return worker.instance_type or worker.preset
