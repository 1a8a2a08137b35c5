"""What a user writes to ask which machines to rent (the `recommend` flow; `hetflow recommend`
takes the same as flags): the job, the instance types that can be had, the objective;
re-exported by `hetflow.config`."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, ValidationInfo, field_validator, model_validator

from hetflow.config.base import MODEL_ALIASES, ConfigModel

# The share of a deadline kept in hand for the prediction's error: a mix counts as in time
# when predicted to finish by (1 - margin) x the deadline. Why this share: docs/recommend.md,
# 'Limits'.
DEADLINE_MARGIN = 0.15

# How old a profile-history entry may be and still stand for its type: train's reuse of it
# (`TrainConfig.profile_max_age_h`) and recommend's measured curves (`ProfileHistory`) alike.
PROFILE_MAX_AGE_H = 24.0

DEFAULT_RENTABLE = (("g4dn.xlarge", 4), ("p3.2xlarge", 2), ("p4d.24xlarge", 1))


class RecommendJob(ConfigModel):
    """The job a mix is chosen for: the model, the batch every step shares, how many steps."""

    recipe: str = Field(
        "resnet50",
        title="Model",
        description="Whose FLOPs per sample and gradient size scale the published step-time "
        "curves: resnet50, bert-large, or a digits model (digits-mlp, digits-cnn, "
        "digits-wide-mlp).",
    )
    global_batch: int = Field(256, ge=1, title="Global batch", description="Samples per step.")
    steps: int = Field(10_000, ge=1, title="Steps")
    precision: Literal["mixed", "fp32"] = Field(
        "mixed",
        title="Precision",
        description="What the job trains in, for its memory cap: 'mixed' (activations in 2 "
        "bytes, as the published configurations the caps come from) or 'fp32' (4 bytes: "
        "about half the local batch).",
    )
    max_local_batch: int | None = Field(
        None,
        ge=1,
        title="Largest local batch",
        description="The largest local batch of any GPU; empty: what its memory holds, where "
        "the model's memory per sample or a measured cap is known.",
    )

    @field_validator("recipe")
    @classmethod
    def _one_name_per_network(cls, v: str) -> str:
        return MODEL_ALIASES.get(v, v)  # training's name of the network (`alias_note`)


class RentableType(ConfigModel):
    """An instance type that may be rented and how many of it can be had."""

    instance_type: str = Field(min_length=1, title="Instance type", examples=["g4dn.xlarge"])
    count: int = Field(ge=1, title="Available", description="How many can be rented.")


def default_rentable() -> list[RentableType]:
    return [RentableType(instance_type=t, count=n) for t, n in DEFAULT_RENTABLE]


class RecommendObjective(ConfigModel):
    """What 'best' means: the least cost (per sample), the least cost that finishes by a
    deadline, or the least time within a budget."""

    kind: Literal["cost", "deadline", "budget"] = Field("cost", title="Objective")
    deadline_h: float | None = Field(
        None, gt=0, allow_inf_nan=False, title="Deadline (hours)", description="For 'deadline'."
    )
    budget_usd: float | None = Field(
        None, gt=0, allow_inf_nan=False, title="Budget (USD)", description="For 'budget'."
    )
    deadline_margin: float = Field(
        DEADLINE_MARGIN,
        ge=0,
        lt=1,
        title="Deadline margin",
        description="For 'deadline': the share of it kept in hand for the prediction's error; "
        "a mix must be predicted to finish by (1 - margin) x the deadline.",
    )

    @field_validator("deadline_margin")
    @classmethod
    def _a_margin_of_a_deadline(cls, v: float, info: ValidationInfo) -> float:
        if v != DEADLINE_MARGIN and info.data.get("kind") != "deadline":
            raise ValueError("only for objective 'deadline'")
        return v

    @model_validator(mode="after")
    def _the_figure_of_the_kind(self):
        wanted = {"deadline": "deadline_h", "budget": "budget_usd"}.get(self.kind)
        for name in ("deadline_h", "budget_usd"):
            if name == wanted and getattr(self, name) is None:
                raise ValueError(f"objective {self.kind!r} needs {name}")
            if name != wanted and getattr(self, name) is not None:
                raise ValueError(f"{name} is only for objective {name.split('_')[0]!r}")
        return self


class SpotOverride(ConfigModel):
    """One candidate's spot figures, in place of the spot table's."""

    instance_type: str = Field(min_length=1, title="Instance type", examples=["g4dn.xlarge"])
    discount: float | None = Field(
        None,
        ge=0,
        lt=1,
        title="Spot discount",
        description="Off On-Demand, in [0, 1); empty: the table's.",
    )
    interruptions_per_month: float | None = Field(
        None,
        ge=0,
        allow_inf_nan=False,
        title="Interruptions per instance-month",
        description="Spot instances of the type reclaimed per month (>= 0); empty: the table's.",
    )


class RecommendMarket(ConfigModel):
    """Where instances are rented: on-demand, on spot (the spot price; time and cost expected
    with each type's interruptions and what a restart costs), or whichever is best. Values are
    checked with the command's one-line errors (`hetflow recommend --market ...`)."""

    kind: Literal["on-demand", "spot", "both"] = Field("on-demand", title="Market")
    spot_table: str | None = Field(
        None,
        title="Spot table",
        description="A JSON file as infra/spot.json (a hand-written snapshot of AWS's Spot "
        "Instance Advisor); empty: that one.",
    )
    overrides: list[SpotOverride] = Field(default_factory=list, title="Per-type spot figures")
    restart_s: float | None = Field(
        None,
        ge=0,
        allow_inf_nan=False,
        title="Restart (s)",
        description="What an interruption costs before training goes on; empty: 16 s, the "
        "training group's restart from its checkpoint, which counts no instance boot: add the "
        "time a replacement instance takes to boot and join.",
    )
    checkpoint_every: int | None = Field(
        None,
        ge=1,
        title="Checkpoint every N steps",
        description="An interruption redoes N/2 steps on average; empty: TrainConfig's (25).",
    )

    @field_validator("spot_table", "overrides", "restart_s", "checkpoint_every")
    @classmethod
    def _spot_figures_of_a_spot_market(cls, v, info: ValidationInfo):
        if v and info.data.get("kind") == "on-demand":
            raise ValueError("only with market spot or both")
        return v

    @property
    def spot(self) -> bool:
        """Whether spot instances are searched."""
        return self.kind != "on-demand"


class ProfileHistory(ConfigModel):
    """Where `recommend` reads measured step-time curves: the profile history that profile,
    train and the demo write (docs/concepts.md, 'Profile history')."""

    url: str = Field(
        "",
        title="Profile history",
        description="e.g. s3://hetflow-data/profiles/types: a type measured there without "
        "emulation, on the job's recipe, gets its measured curve and memory cap; empty: the "
        "published curves only.",
    )
    max_age_h: float = Field(24.0, gt=0, allow_inf_nan=False, title="Use profiles up to (hours)")


class RecommendRequest(ConfigModel):
    """One question to `recommend`, as the command's flags and the flow's form both ask it:
    the job, the instance types that can be had, the objective, the market and the profile
    history whose measured curves it reads; validated once, here."""

    job: RecommendJob = Field(default_factory=RecommendJob)
    candidates: list[RentableType] = Field(default_factory=default_rentable, min_length=1)
    objective: RecommendObjective = Field(default_factory=RecommendObjective)
    market: RecommendMarket = Field(default_factory=RecommendMarket)
    history: ProfileHistory = Field(default_factory=ProfileHistory)

    @field_validator("candidates")
    @classmethod
    def _each_type_once(cls, v: list[RentableType]) -> list[RentableType]:
        names = [c.instance_type for c in v]
        if len(set(names)) != len(names):
            raise ValueError(f"an instance type appears twice ({', '.join(names)})")
        return v

    @property
    def names(self) -> list[str]:
        """The candidates' instance types, in order."""
        return [c.instance_type for c in self.candidates]
