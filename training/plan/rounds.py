"""The plan of `strategy: diloco` (pure): a round's samples shared as whole inner steps, each
worker's count in proportion to its speed at the inner batch, so that every worker's inner
steps take the same time and none waits for another inside a round. The synchronous plan sizes
each worker's share of one step; this one sizes how many steps each takes.

    >>> inner_counts([1.0, 1.0, 2.0, 4.0], 32)
    [4, 4, 8, 16]

A run's `TrainConfig` counts samples as the synchronous run does (`steps` x `global_batch`),
and keeps meaning that: the rounds are fields of their own (`DiLoCoConfig.rounds`,
`round_samples`, `round_inner_batch`, `round_eval_every`, `round_checkpoint_every`), derived
from the plan once, before launch (`resolve_rounds`), and carried to the ranks in the run
spec. The loop counts what `loop_counts` says: steps, or under diloco rounds, one loop turn
being one round of inner steps of the inner batch.
"""

from __future__ import annotations

import math
from typing import NamedTuple

from hetflow.config import ClusterSpec, ConfigError, TrainConfig
from hetflow.perf.curve import Line
from hetflow.records import Plan, Profile
from hetflow.training.plan.balance import equal_batches

ROUNDS_REASON = "strategy 'diloco': rounds of local steps, no gradient all-reduce"


def inner_batch(train: TrainConfig, world: int) -> int:
    """Samples of one inner step on every worker: `diloco.inner_batch`, else the global
    batch's even share, at least 1.

    >>> inner_batch(TrainConfig(global_batch=128), 4)
    32
    """
    return train.diloco.inner_batch or max(1, train.global_batch // world)


def round_samples(train: TrainConfig, world: int) -> int:
    """The samples of one round over `world` workers as `round_steps` sizes it: `round_steps`
    x the workers' inner steps (a plan with `diloco.round_s` sizes its own).

    >>> round_samples(TrainConfig(strategy="diloco", global_batch=128), 4)
    2048
    """
    return train.diloco.round_steps * world * inner_batch(train, world)


def resolve_rounds(train: TrainConfig, plan: Plan) -> TrainConfig:
    """`train` with its rounds derived for `plan` (pure; unchanged for the other strategies):
    a round is the plan's samples (every launched worker's share), the run as many rounds as
    cover the samples asked for (steps x global_batch), evaluation and checkpoints every as
    many rounds as cover the synchronous steps asked for (at least 1), the inner batch
    (`inner_batch` over the plan's workers), and no lr warm-up (the scheduler steps once a
    round). `steps`, `global_batch`, `eval_every` and `checkpoint_every` keep their meaning.
    Derived from the fields a user sets alone, so a plan over fewer workers derives anew.

    >>> from hetflow.records import Plan
    >>> t = TrainConfig(strategy="diloco", steps=100, global_batch=128)
    >>> d = resolve_rounds(t, Plan.equal([512] * 4)).diloco
    >>> d.rounds, d.round_samples, d.round_eval_every, d.round_checkpoint_every, d.round_inner_batch
    (7, 2048, 1, 1, 32)
    """
    if train.strategy != "diloco":
        return train
    world, samples, g = len(plan.local_batches), sum(plan.local_batches), train.global_batch
    rounds = {
        "rounds": math.ceil(train.steps * g / samples),
        "round_samples": samples,
        "round_inner_batch": inner_batch(train, world),
        "round_eval_every": max(1, train.eval_every * g // samples),
        "round_checkpoint_every": max(1, train.checkpoint_every * g // samples),
    }
    diloco = train.diloco.model_copy(update=rounds)
    return train.model_copy(update={"lr_warmup_steps": 0, "diloco": diloco})


def has_rounds(train: TrainConfig, plan: Plan) -> bool:
    """Whether `train`'s rounds are derived for `plan` (`resolve_rounds`); True for the other
    strategies, which have none."""
    if train.strategy != "diloco":
        return True
    d, world = train.diloco, len(plan.local_batches)
    return (
        d.rounds is not None
        and d.round_samples == sum(plan.local_batches)
        and d.round_inner_batch == inner_batch(train, world)
    )


class LoopCounts(NamedTuple):
    """What the training loop counts: its turns (`steps`), the samples of one
    (`global_batch`), and every how many turns it evaluates and checkpoints."""

    steps: int
    global_batch: int
    eval_every: int
    checkpoint_every: int


def loop_counts(train: TrainConfig) -> LoopCounts:
    """The loop's turns of `train`: its steps; under diloco its rounds, which must be derived
    (`resolve_rounds`: a ValueError otherwise). The workers and the train task both count
    by it."""
    if train.strategy != "diloco":
        return LoopCounts(train.steps, train.global_batch, train.eval_every, train.checkpoint_every)
    d = train.diloco
    if d.rounds is None or d.round_samples is None:
        raise ValueError(
            "loop_counts: a diloco config whose rounds are not derived (resolve_rounds)"
        )
    return LoopCounts(d.rounds, d.round_samples, d.round_eval_every, d.round_checkpoint_every)


def inner_counts(rates: list[float], total: int) -> list[int]:
    """`total` inner steps shared in proportion to `rates` (each worker's samples/s at the
    inner batch), largest remainder first, at least one each: worker r's count k_r is within
    one step of total x rate_r / sum(rates), so k_r x (its inner step) is within one of its
    steps of the round's common length, the time every worker spends.

    >>> inner_counts([1.0, 3.0], 10)
    [3, 7]
    >>> inner_counts([1.0, 100.0], 10)
    [1, 9]
    """
    if total < len(rates):
        raise ValueError(f"{total} inner steps cannot give each of {len(rates)} workers one")
    weight = sum(rates)
    exact = [total * r / weight for r in rates]
    counts = [max(1, math.floor(x)) for x in exact]
    while sum(counts) > total:  # the minimum of 1 took steps from the others
        i = max(range(len(counts)), key=lambda j: (counts[j] - exact[j], counts[j]))
        counts[i] -= 1
    order = sorted(range(len(rates)), key=lambda j: exact[j] - counts[j], reverse=True)
    for i in order[: total - sum(counts)]:
        counts[i] += 1
    return counts


def round_plan(profile: Profile, cluster: ClusterSpec, train: TrainConfig) -> Plan:
    """The plan of a diloco run: each worker's share of a round (`round_samples`, or with
    `diloco.round_s` the inner steps the workers make in that time) as whole inner steps, by
    its samples/s at the inner batch on the profile's step model (the performance model's
    `Line`), or the equal split (schedule 'equal'). No worker is left out: the slowest takes
    at least one inner step. A one-line ConfigError where a worker's memory cap is under the
    inner batch."""
    world = cluster.world_size
    b = inner_batch(train, world)
    for w in cluster.workers:
        if w.memory_cap_batch is not None and w.memory_cap_batch < b:
            raise ConfigError(
                f"cluster.workers[{w.name}].memory_cap_batch: {w.memory_cap_batch} is under "
                f"the inner batch of strategy 'diloco' ({b}: global_batch / workers)"
            )
    latency, per_sample = profile.step_models()
    lines = [Line(a, c) for a, c in zip(latency, per_sample, strict=True)]
    rates = [b / max(line.time(b), 1e-12) for line in lines]
    total = round_samples(train, world) // b
    if train.diloco.round_s is not None:  # the inner steps the workers make in round_s
        total = max(world, round(train.diloco.round_s * sum(rates) / b))
    if train.schedule == "equal":
        shares = equal_batches(world, total * b)
    else:
        shares = [k * b for k in inner_counts(rates, total)]
    return Plan(
        local_batches=shares,
        speeds=[r.samples_per_s for r in profile.ranks],
        latency_s=latency,
        per_sample_s=per_sample,
        compression_reason=ROUNDS_REASON,
    )
