"""The options of `strategy: diloco` (`TrainConfig.diloco`): DiLoCo-style rounds of local
steps, each worker taking as many as its speed allows, and the outer step that averages them.

A round is `round_steps` synchronous steps' worth of samples (`round_steps` x the global
batch), shared among the workers in proportion to their speed at the inner batch (the global
batch's even share per worker): each worker runs its share as inner steps with its own
optimizer, then every worker's change since the round began is averaged, weighted by the
samples it trained on, and an outer SGD step with Nesterov momentum applies it.

    >>> DiLoCoConfig().round_steps, DiLoCoConfig().send
    (16, 'fp32')

`TrainConfig.steps`, `global_batch`, `eval_every` and `checkpoint_every` keep their meaning
under diloco (synchronous steps' worth of samples). What the loop counts in rounds is derived
from them and the plan before launch (`training.plan.rounds.resolve_rounds`) into the fields
`rounds`, `round_samples`, `round_inner_batch`, `round_eval_every` and
`round_checkpoint_every`: left out of the form, empty in a config a user writes (a value set
there is replaced when the run is planned), filled in the run spec the ranks read and in the
MLflow run's params.
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field
from pydantic.json_schema import SkipJsonSchema

from hetflow.config.base import ConfigError, ConfigModel


class DiLoCoConfig(ConfigModel):
    """What `strategy: diloco` runs with; ignored by the other strategies, except `staleness`,
    which they refuse (`check_job`)."""

    round_steps: int = Field(
        16,
        ge=1,
        title="Round length (synchronous steps' worth)",
        description="A round is this many synchronous steps' worth of samples (round_steps x "
        "global_batch), shared by speed; train.steps counts samples as the synchronous run "
        "does, so the run is ceil(steps / round_steps) rounds.",
    )
    round_s: float | None = Field(
        None,
        gt=0,
        title="Round length (seconds)",
        description="Set: a round is what the workers compute in this many seconds at the "
        "inner batch on the plan's step model (the profile's; a prior's seconds are its "
        "published devices'), in place of round_steps.",
    )
    inner_batch: int | None = Field(
        None,
        ge=1,
        title="Inner batch",
        description="Samples of one inner step on every worker. Empty: global_batch / workers.",
    )
    outer_lr: float = Field(
        0.7,
        gt=0,
        title="Outer learning rate",
        description="The outer SGD's lr on the averaged change (DiLoCo's 0.7).",
    )
    outer_momentum: float = Field(
        0.9, ge=0, lt=1, title="Outer Nesterov momentum", description="0: plain outer SGD."
    )
    send: Literal["fp32", "bf16", "int8"] = Field(
        "fp32",
        title="Outer change sent as",
        description="fp32 or bf16: one all-reduce of the weighted change; int8: each worker's "
        "change quantized to 8 bits with one scale, all-gathered and summed.",
    )
    staleness: int = Field(
        0,
        ge=0,
        le=8,
        title="Bounded staleness (rounds)",
        description="0: every round ends with the average. s > 0: a round's average is "
        "applied s rounds later, and a worker runs up to s rounds ahead of the slowest while "
        "it travels (docs/diloco.md says which scheme, and where it loses).",
    )
    # Derived before launch (`resolve_rounds`), not set by a user: see the module.
    rounds: SkipJsonSchema[int | None] = Field(
        None,
        ge=1,
        description="Derived: the rounds the run takes, ceil(steps x "
        "global_batch / round_samples).",
    )
    round_samples: SkipJsonSchema[int | None] = Field(
        None,
        ge=1,
        description="Derived: the samples of one round, every worker's share of the plan.",
    )
    round_inner_batch: SkipJsonSchema[int | None] = Field(
        None, ge=1, description="Derived: the inner batch, inner_batch or global_batch / workers."
    )
    round_eval_every: SkipJsonSchema[int | None] = Field(
        None,
        ge=1,
        description="Derived: rounds between evaluations, those covering "
        "eval_every synchronous steps (at least 1).",
    )
    round_checkpoint_every: SkipJsonSchema[int | None] = Field(
        None,
        ge=1,
        description="Derived: rounds between checkpoints, those covering "
        "checkpoint_every synchronous steps (at least 1).",
    )


def check_rounds(train, fp16: list[str]) -> None:
    """What `strategy: diloco` cannot run with (`hetflow.config.check_job`, which passes the
    `TrainConfig` and the fields that make a worker compute in fp16): staleness without rounds; a
    compression method, local SGD or micro-batches (each reshapes a synchronous step, and a
    round has none); the 'skip' of a non-finite gradient and fp16's loss scale (both need
    every rank to see the same gradient each step, which no inner step shares)."""
    if train.strategy != "diloco":
        if train.diloco.staleness:
            raise ConfigError(
                f"train.diloco.staleness: {train.diloco.staleness} needs rounds to be stale "
                f"by, and strategy {train.strategy!r} has none; set strategy 'diloco' or 0"
            )
        return
    if train.compression != "none":
        raise ConfigError(
            f"train.compression: {train.compression!r} compresses DDP's gradient, and strategy "
            "'diloco' sends none; set the outer change's encoding with train.diloco.send"
        )
    refusals = [
        (train.allow_local_sgd, "train.allow_local_sgd", "leave it off"),
        (train.accumulate == "auto", "train.accumulate", "use 'off'"),
        (train.nonfinite == "skip", "train.nonfinite", "use 'fail'"),
    ]
    for bad, name, fix in refusals:
        if bad:
            raise ConfigError(
                f"{name}: strategy 'diloco' has no synchronous step for it to act on; {fix}"
            )
    if fp16:
        raise ConfigError(
            f"{fp16[0]}: fp16's skipped steps must be the same on every rank, which strategy "
            "'diloco' (no all-reduce every step) cannot promise; use bf16 or fp32"
        )
