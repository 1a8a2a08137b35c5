"""The training job's section of the config: `TrainConfig` (what one run trains and how), the
learning-rate rules, and the default cluster of the demo's speeds.

    >>> ClusterSpec.from_speeds([1, 1, 2, 4]).slowdowns()
    [32.0, 32.0, 16.0, 8.0]
"""

from __future__ import annotations

import difflib
import math
from typing import Literal

from pydantic import Field, ValidationInfo, field_validator
from pydantic.json_schema import SkipJsonSchema

from hetflow.config.base import (
    BUILTIN_RECIPES,
    RECIPE_ALIASES,
    RECIPE_DESCRIPTION,
    RECIPE_PATTERN,
    ConfigModel,
)
from hetflow.config.cluster import ClusterSpec, WorkerSpec
from hetflow.config.diloco import DiLoCoConfig
from hetflow.config.faults import FaultPolicy
from hetflow.config.recommend import (
    PROFILE_MAX_AGE_H,
)
from hetflow.records import LOCAL_SGD, CompressionMethod

# What 'auto' tries by default (`TrainConfig.compression_candidates`): the methods that keep
# plain SGD's semantics, from the least lossy to the strongest compression.
AUTO_CANDIDATES = ("none", "fp16", "bf16", "powersgd:4")
# How a learning rate tuned at one global batch follows another (`lr_factor`).
LR_RULES = ("linear", "sqrt", "none")


def lr_factor(rule: str, global_batch: int, tuned_batch: int | None) -> float:
    """What `rule` multiplies a learning rate tuned at `tuned_batch` by at `global_batch`:
    the ratio ('linear'), its square root ('sqrt'), or 1 ('none', or no tuned batch).

    >>> lr_factor("linear", 512, 128), lr_factor("sqrt", 512, 128), lr_factor("none", 512, 128)
    (4.0, 2.0, 1.0)
    """
    if rule == "none" or tuned_batch is None:
        return 1.0
    ratio = global_batch / tuned_batch
    return ratio if rule == "linear" else math.sqrt(ratio)


# TrainConfig declares its fields in the order the run form shows them (`form_schema` gives
# each its position), what a user changes first first; the knobs that tune the machinery
# rather than the run ('auto''s candidates, the re-balancer's settings, threads, the stall
# timeout, the failure policy) are left out of the form (`SkipJsonSchema`), settable in YAML.
class TrainConfig(ConfigModel):
    """What to train and how the batch is shared: the same for every variant but the knobs."""

    recipe: str = Field(
        "digits-cnn",
        title="Recipe",
        description=RECIPE_DESCRIPTION,
        pattern=RECIPE_PATTERN,
        json_schema_extra={"examples": list(BUILTIN_RECIPES)},
    )
    steps: int = Field(
        200, ge=1, title="Optimizer steps", description="How long the run trains, in steps."
    )
    global_batch: int = Field(128, ge=1, title="Global batch", description="Samples per step.")
    schedule: Literal["equal", "proportional", "dynamic"] = Field(
        "dynamic",
        title="Batch schedule",
        description="'equal': the same local batch everywhere; 'proportional': by profiled "
        "speed; 'dynamic': from a prior, re-planned from the training steps.",
    )
    compression: str = Field(
        "none",
        title="Gradient communication",
        description="How gradients are sent; 'auto' tries the candidates a few steps each on "
        "the cluster and keeps the one with the shortest step.",
    )
    target_accuracy: float | None = Field(
        0.95,
        gt=0,
        le=1,
        title="Target test accuracy",
        description="time_to_target_s is the training time until this accuracy is first met "
        "(recipes that evaluate accuracy).",
    )
    target_val_loss: float | None = Field(
        None,
        gt=0,
        title="Target validation loss",
        description="time_to_target_s is the training time until the validation loss first "
        "falls to this (recipes that evaluate val_loss, e.g. 'gpt').",
    )
    precision: Literal["fp32", "bf16", "fp16", "auto"] = Field(
        "fp32",
        title="Precision",
        description="The forward pass's autocast: 'auto' is bf16 where the device has it natively "
        "(CUDA compute capability >= 8.0), fp16 with a loss scale shared by every rank on older "
        "GPUs, fp32 on a CPU.",
    )
    strategy: Literal["ddp", "fsdp", "diloco"] = Field(
        "ddp",
        title="Data parallelism",
        description="'ddp': each worker holds the whole model; 'fsdp': it is sharded across "
        "them (docs/fsdp.md); 'diloco': rounds of local steps (docs/diloco.md).",
    )
    # their length, the outer step, how the change is sent, bounded staleness
    diloco: DiLoCoConfig = Field(DiLoCoConfig(), title="DiLoCo rounds (strategy 'diloco')")
    accumulate: Literal["off", "auto"] = Field(
        "off",
        title="Micro-batches",
        description="'auto': a worker whose share passes its memory cap runs it as micro-batches "
        "(each at most the cap) and accumulates their gradients, and the plan gives it more "
        "than its cap where that shortens the step; 'off': no share passes its cap.",
    )
    recipe_options: dict[str, int | float | str] = Field(
        {},
        title="Recipe options",
        description="Keyword arguments of the recipe, e.g. {'n_layer': 6, 'context': 256} for "
        "'gpt'.",
    )
    optimizer: Literal["recipe", "sgd", "adam", "adamw"] = Field(
        "recipe",
        title="Optimizer",
        description="'recipe': the recipe's own (SGD for the digits and resnet recipes, AdamW "
        "for 'gpt'); or sgd | adam | adamw.",
    )
    lr: float | None = Field(
        None,
        gt=0,
        title="Learning rate",
        description="Empty: the recipe's, when the optimizer is the recipe's, scaled to the "
        "global batch by the recipe's rule (lr_scaling); else the optimizer's usual one (sgd "
        "0.05, adam/adamw 0.001). Set: used as given, unless lr_scaling is set too.",
    )
    lr_scaling: Literal["linear", "sqrt", "none"] | None = Field(
        None,
        title="Learning rate scaling",
        description="How the lr follows the global batch: lr x (global_batch / tuned batch) "
        "('linear'), x its square root ('sqrt'), or as given ('none'). Empty: the recipe's rule "
        "when the lr is the recipe's; 'none' when lr is set here. Set with lr, lr is read as "
        "the lr at the tuned batch.",
        # left out of dumps when empty: Prefect's server refuses a null that is not one of an
        # enum's values in the form's defaults (`config.base.form_schema`)
        exclude_if=lambda v: v is None,
    )
    lr_tuned_batch: int | None = Field(
        None,
        ge=1,
        title="Batch the lr was tuned for",
        description="The global batch lr was tuned at. Empty: the recipe's (Recipe.tuned_batch).",
    )
    lr_warmup_steps: int | None = Field(
        None,
        ge=0,
        title="Learning rate warm-up steps",
        description="Steps over which the lr rises linearly from the tuned lr to the scaled one "
        "(where scaling raises it). Empty: the recipe's.",
    )
    momentum: float = Field(0.9, ge=0, lt=1, title="SGD momentum")
    weight_decay: float | None = Field(
        None,
        ge=0,
        title="Weight decay",
        description="Empty: the recipe's, when the optimizer is the recipe's; else 0. AdamW "
        "decays the weight matrices only, not biases or norms.",
    )
    seed: int = Field(
        0,
        title="Seed",
        description="Weights' initialization and data order; the same seed, the same run.",
    )
    eval_every: int = Field(10, ge=1, title="Evaluate every N steps")
    allow_local_sgd: bool = Field(
        False,
        title="'auto' may average models",
        description="Let 'auto' also try localsgd:4 (and hierarchical:4 where the workers span "
        "several nodes), which average the model every 4 steps instead of the gradient every "
        "step: the optimizer then computes something else, and accuracy may differ.",
    )
    compression_candidates: SkipJsonSchema[list[str]] = Field(
        list(AUTO_CANDIDATES),
        title="'auto': the methods tried",
        description="What 'auto' tries, in this order (the first of equal steps is kept). "
        "localsgd:H and hierarchical:H only with allow_local_sgd.",
    )
    rebalance_every: SkipJsonSchema[int] = Field(
        10,
        ge=1,
        title="Re-balance check every K steps",
        description="Also at once when a rank's step time jumps by more than 3 x the threshold "
        "(or 4 standard deviations of the noise measured) for three steps in a row.",
    )
    rebalance_threshold: SkipJsonSchema[float] = Field(
        0.10, gt=0, title="Re-balance threshold", description="Imbalance (max/mean - 1) to act."
    )
    profile_first: bool = Field(
        False,
        title="Profile before step 0",
        description="'dynamic': profile the workers (or reuse the profile history) before the "
        "first step and plan from that. Off: start at once from the best prior (the profile "
        "history, the presets' or instance types' published ratios, else the equal split) and "
        "learn each worker's step-time curve from the training steps. 'proportional' always "
        "profiles first.",
    )
    profile_max_age_h: float = Field(
        PROFILE_MAX_AGE_H,
        ge=0,
        title="Reuse profiles up to (hours)",
        description="A worker whose type (instance type or preset, the same recipe, batch, "
        "precision and versions) was profiled this recently is not profiled again: its figures "
        "come from the profile history in S3 (docs/concepts.md, 'Profile history'); 0: always "
        "profile every worker.",
    )
    checkpoint_every: int = Field(
        25,
        ge=1,
        title="Checkpoint every N steps",
        description="A restarted worker resumes from the last checkpoint: "
        "at most N steps are redone.",
    )
    nonfinite: Literal["fail", "skip"] = Field(
        "fail",
        title="On a NaN/Inf gradient",
        description="'fail': stop the run, naming the step; 'skip': skip that optimizer step on "
        "every rank alike (the all-reduced gradient is checked, the same on every rank).",
    )
    stall_timeout_s: SkipJsonSchema[float] = Field(
        300.0,
        gt=0,
        title="Stall timeout (s)",
        description="A rank that makes no progress this long (stopped, a hung read) times out "
        "the others' collectives: the group restarts from the last checkpoint. Longer than the "
        "slowest step, evaluation or checkpoint save.",
    )
    threads_per_rank: SkipJsonSchema[int] = Field(1, ge=1, title="Torch threads per rank")
    faults: SkipJsonSchema[FaultPolicy] = Field(
        default_factory=FaultPolicy,
        title="Failures and retries",
        description="Who retries what after a failure, how many times and after how long: "
        "the launcher's group restarts, Ray's placement, the Prefect task's retries.",
    )

    @field_validator("recipe")
    @classmethod
    def _recipe(cls, v: str) -> str:
        v = RECIPE_ALIASES.get(v, v)  # recommend's name of the network (`alias_note`)
        if ":" not in v and v not in BUILTIN_RECIPES:
            close = difflib.get_close_matches(v, BUILTIN_RECIPES, n=1)
            hint = f"did you mean {close[0]}? " if close else ""
            raise ValueError(
                f"unknown recipe {v!r}; {hint}choose one of {', '.join(BUILTIN_RECIPES)}, or "
                "give an import path package.module:Name"
            )
        return v

    @field_validator("compression")
    @classmethod
    def _compression(cls, v: str) -> str:
        return v if v == "auto" else str(CompressionMethod.parse(v))

    @field_validator("compression_candidates")
    @classmethod
    def _candidates(cls, v: list[str], info: ValidationInfo) -> list[str]:
        if not v:
            raise ValueError("'auto' needs at least one method to try")
        methods = [CompressionMethod.parse(m) for m in v]  # ValueError: 'unknown method ...'
        if len(set(methods)) != len(methods):
            raise ValueError(f"a method appears twice ({', '.join(v)})")
        local = [str(m) for m in methods if m.name in LOCAL_SGD]
        if local and not info.data.get("allow_local_sgd"):
            raise ValueError(
                f"{local[0]} averages the model instead of the gradient, which changes what the "
                "optimizer computes: set allow_local_sgd to let 'auto' try it"
            )
        return [str(m) for m in methods]

    def scaled_lr(self) -> float:
        """The lr of a resolved config (`training.loop.optim.resolve_optimizer`) at its global
        batch: `lr` x `lr_factor(lr_scaling, global_batch, lr_tuned_batch)`; what the warm-up
        ends at. The re-balancer changes local batches, never the global one: it applies at
        the start and holds for the whole run."""
        if self.lr is None or self.lr_scaling is None:
            raise ValueError("scaled_lr needs a resolved TrainConfig (resolve_optimizer)")
        return self.lr * lr_factor(self.lr_scaling, self.global_batch, self.lr_tuned_batch)

    def compression_method(self) -> CompressionMethod | None:
        """The method set here, parsed; None for 'auto', which the workers resolve by trials."""
        return None if self.compression == "auto" else CompressionMethod.parse(self.compression)

    def local_sgd(self) -> tuple[str, str] | None:
        """(the field, the method) where this config may run local SGD or hierarchical
        averaging: the method set, or one 'auto' may try (`allow_local_sgd`); else None."""
        method = self.compression_method()
        if method is not None:
            return ("train.compression", method.name) if method.name in LOCAL_SGD else None
        return ("train.allow_local_sgd", "local SGD") if self.allow_local_sgd else None

    def compared(self) -> dict[str, TrainConfig]:
        """The configs a comparison runs, by variant: this config's knobs with each variant's
        schedule and compression (`variant`)."""
        knobs = self.model_dump(exclude={"schedule", "compression"})
        return {v: TrainConfig.variant(v, **knobs) for v in ("baseline", "optimized")}

    @classmethod
    def variant(cls, name: Literal["baseline", "optimized"], **kw) -> TrainConfig:
        """The two variants of a job: baseline = equal split, no compression; optimized =
        re-balanced, compression 'auto' (none under fsdp, which has no comm hook to compress).
        Under diloco the baseline is the sized synchronous run (DDP, re-balanced, 'auto') and
        the optimized variant the rounds, re-balanced."""
        strategy = kw.get("strategy")
        knobs = {
            "baseline": {"schedule": "equal", "compression": "none"},
            "optimized": {
                "schedule": "dynamic",
                "compression": "none" if strategy in ("fsdp", "diloco") else "auto",
            },
        }[name]
        if strategy == "diloco" and name == "baseline":
            knobs = {"strategy": "ddp", "schedule": "dynamic", "compression": "auto"}
            knobs |= {"diloco": DiLoCoConfig()}
        return cls(**{**kw, **knobs})


DEFAULT_SPEEDS = [1.0, 1.0, 2.0, 4.0]


def default_cluster() -> ClusterSpec:
    """The demo's 4 emulated workers, relative speeds 1, 1, 2, 4."""
    return ClusterSpec.from_speeds(DEFAULT_SPEEDS, name="demo-1-1-2-4")


def link_cluster(
    gbps: float, latency_ms: float, world: int = 4, time_scale: float | None = None
) -> ClusterSpec:
    """`world` equal emulated workers, each behind a link of `gbps` (0: loopback) and
    `latency_ms`, at `time_scale` (default: the cluster's): where communication is what
    differs (`hetflow bench comm`, calibration)."""
    workers = [
        WorkerSpec(name=f"w{i}", speed=1.0, link_gbps=gbps or None, link_latency_ms=latency_ms)
        for i in range(world)
    ]
    name = f"comm-{gbps:g}gbps" if gbps else "comm-loopback"
    scale = {} if time_scale is None else {"time_scale": time_scale}
    return ClusterSpec(name=name, workers=workers, **scale)
