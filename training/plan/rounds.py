"""The plan of `strategy: diloco` (pure): a round's samples shared as whole inner steps, each
worker's count in proportion to its speed at the inner batch, so that every worker's inner
steps take the same time and none waits for another inside a round. The synchronous plan sizes
each worker's share of one step; this one sizes how many steps each takes.

    >>> inner_counts([1.0, 1.0, 2.0, 4.0], 32)
    [4, 4, 8, 16]

A run's `TrainConfig` counts samples as the synchronous run does (`steps` x `global_batch`);
the loop counts rounds (`round_config`): one loop step is one round of `round_steps` x
`global_batch` samples, run as inner steps of the inner batch (`inner_batch`).
"""

from __future__ import annotations

import math

from hetflow.config import ClusterSpec, ConfigError, TrainConfig
from hetflow.records import Plan, Profile
from hetflow.training.plan.balance import equal_batches

ROUNDS_REASON = "strategy 'diloco': rounds of local steps, no gradient all-reduce"


def inner_batch(train: TrainConfig, world: int) -> int:
    """Samples of one inner step on every worker: the global batch's even share, at least 1.

    >>> inner_batch(TrainConfig(global_batch=128), 4)
    32
    """
    return max(1, train.global_batch // world)


def round_config(train: TrainConfig, world: int) -> TrainConfig:
    """The loop's view of a diloco run over `world` workers: one step per round (`steps`
    rounds: ceil(steps / round_steps)), a round's samples as its global batch (whole inner
    steps: `round_steps` x the workers' inner steps), evaluation and checkpoints every as
    many rounds as cover the synchronous steps asked for (at least 1), and no lr warm-up (the
    scheduler steps once a round). Unchanged for the other strategies.

    >>> t = round_config(TrainConfig(strategy="diloco", steps=100, global_batch=128), 4)
    >>> t.steps, t.global_batch, t.eval_every, t.checkpoint_every
    (7, 2048, 1, 1)
    """
    if train.strategy != "diloco":
        return train
    h, b = train.diloco.round_steps, inner_batch(train, world)
    return train.model_copy(
        update={
            "steps": math.ceil(train.steps / h),
            "global_batch": h * world * b,
            "eval_every": max(1, train.eval_every // h),
            "checkpoint_every": max(1, train.checkpoint_every // h),
            "lr_warmup_steps": 0,
        }
    )


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
    """The plan of a diloco run: each worker's share of a round (`round_config`'s global
    batch) as whole inner steps, by its samples/s at the inner batch on the profile's step
    model (or the equal split, schedule 'equal'). No worker is left out: the slowest takes at
    least one inner step. A one-line ConfigError where a worker's memory cap is under the
    inner batch."""
    world = cluster.world_size
    b = inner_batch(train, world)
    for w in cluster.workers:
        if w.memory_cap_batch is not None and w.memory_cap_batch < b:
            raise ConfigError(
                f"cluster.workers[{w.name}].memory_cap_batch: {w.memory_cap_batch} is under "
                f"the inner batch of strategy 'diloco' ({b}: global_batch / workers)"
            )
    total = round_config(train, world).global_batch // b
    latency, per_sample = profile.step_models()
    if train.schedule == "equal":
        shares = equal_batches(world, total * b)
    else:
        rates = [b / max(a + c * b, 1e-12) for a, c in zip(latency, per_sample, strict=True)]
        shares = [k * b for k in inner_counts(rates, total)]
    return Plan(
        local_batches=shares,
        speeds=[r.samples_per_s for r in profile.ranks],
        latency_s=latency,
        per_sample_s=per_sample,
        compression_reason=ROUNDS_REASON,
    )
