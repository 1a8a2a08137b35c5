"""The flags of a job (`demo`, `train`, `profile`) and the validated configs they make.

Defaults are the config models' own (`TrainConfig()`, `DatasetSpec()`, `DEFAULT_SPEEDS`). Every
value is checked here before a command imports Prefect or MLflow: each flag by its model, then
the job as a whole once (`training.job.resolve_job`: the rules across models before torch is
imported, then the recipe, the optimizer and the devices), into the one value the command
passes to its flow. A bad
value is refused at once, in one line that names its flag or field.
"""

from __future__ import annotations

import argparse
from typing import NamedTuple

from pydantic import ValidationError

from hetflow.cli.args import add_recipe_arg, add_strategy_arg, choices, recipe_flag, recipe_options
from hetflow.cli.checks import check_instance_types
from hetflow.cli.errors import say_alias
from hetflow.config import (
    BUILTIN_RECIPES,
    DEFAULT_SPEEDS,
    RECIPE_ALIASES,
    ClusterSpec,
    ConfigError,
    DatasetSpec,
    TrainConfig,
    default_cluster,
    parse_speeds,
)
from hetflow.training.job import ResolvedJob, resolve_job

TRAIN = TrainConfig()
DATASET = DatasetSpec()
# the flag of each model field that has one: a validation error names the flag
FLAGS = {
    "steps": "--steps",
    "recipe": "--recipe",
    "recipe_options": "--recipe-option",
    "global_batch": "--global-batch",
    "seed": "--seed",
    "allow_local_sgd": "--allow-local-sgd",
    "strategy": "--strategy",
    "profile_max_age_h": "--profile-max-age-h",
    "profile_first": "--profile-first",
    "url": "--dataset-url",
}


def add_compression_args(p: argparse.ArgumentParser) -> None:
    """--allow-local-sgd (`TrainConfig.allow_local_sgd`) and --strategy."""
    p.add_argument(
        "--allow-local-sgd",
        action="store_true",
        dest="allow_local_sgd",
        help="let the optimized variant's compression 'auto' also try local SGD (localsgd:4; "
        "hierarchical:4 across nodes), which averages the model every 4 steps instead of the "
        "gradient every step",
    )
    # how the gradient travels: DDP's all-reduce, or FSDP's shards
    add_strategy_arg(p, choices(TrainConfig, "strategy"), TRAIN.strategy)


def add_accumulate_arg(p: argparse.ArgumentParser) -> None:
    """--accumulate (`TrainConfig.accumulate`)."""
    p.add_argument(
        "--accumulate",
        choices=choices(TrainConfig, "accumulate"),
        default=TRAIN.accumulate,
        help="auto: a worker whose share passes its memory cap runs it as micro-batches, and "
        "the plan may give it more than its cap where that shortens the step",
    )


def add_plan_args(p: argparse.ArgumentParser) -> None:
    """What the plan is made from: --accumulate, --profile-first, --profile-max-age-h."""
    add_accumulate_arg(p)
    p.add_argument(
        "--profile-first",
        dest="profile_first",
        action="store_true",
        help="the dynamic schedule profiles the workers (or reuses the history) before its "
        "first step; by default it starts at once from a prior and learns from its steps",
    )
    add_profile_age_arg(p)


def add_profile_age_arg(p: argparse.ArgumentParser) -> None:
    """--profile-max-age-h (`TrainConfig.profile_max_age_h`)."""
    p.add_argument(
        "--profile-max-age-h",
        dest="profile_max_age_h",
        type=float,
        default=TRAIN.profile_max_age_h,
        metavar="HOURS",
        help="reuse a worker type's profile from the history in S3 when it is at most this old "
        "and measured for the same recipe, batch, precision and versions; types without one "
        "are profiled on one worker each; 0: profile every worker (default: %(default)g)",
    )


def add_job_args(p: argparse.ArgumentParser) -> None:
    speeds = ",".join(f"{s:g}" for s in DEFAULT_SPEEDS)
    p.add_argument(
        "--speeds",
        help="relative speeds of the emulated workers, one per worker, comma-separated, or "
        "device presets (t4, v100, a100: published per-batch curves) "
        f"(default: {speeds}, unless --cluster is given)",
    )
    p.add_argument(
        "--cluster",
        metavar="FILE",
        help="a cluster file (YAML or JSON, a ClusterSpec) instead of --speeds",
    )
    p.add_argument("--steps", type=int, default=TRAIN.steps, help="optimizer steps per variant")
    add_recipe_arg(p, TRAIN.recipe, BUILTIN_RECIPES)
    add_compression_args(p)
    p.add_argument(
        "--global-batch",
        type=int,
        dest="global_batch",
        default=TRAIN.global_batch,
        help="samples per optimizer step, shared among the workers",
    )
    p.add_argument(
        "--seed", type=int, default=TRAIN.seed, help="seed of the initial weights and data order"
    )
    p.add_argument(
        "--precision",
        choices=choices(TrainConfig, "precision"),
        default=TRAIN.precision,
        help="the forward pass's autocast: auto is bf16 on GPUs that have it natively, fp16 "
        "with a shared loss scale on older ones, fp32 on a CPU",
    )
    add_plan_args(p)
    p.add_argument(
        "--launcher",
        choices=choices(ClusterSpec, "launcher"),
        help="local: torchrun on this host (default, unless --cluster says); ray: Ray Train on "
        "the Ray cluster at --ray-address, each worker on a node of its instance type",
    )
    p.add_argument(
        "--ray-address",
        dest="ray_address",
        help="the Ray cluster's address (default: $RAY_ADDRESS, else auto)",
    )
    p.add_argument(
        "--device",
        choices=("auto", "cuda", "cpu"),
        help="every worker's device (default: each worker's own in --cluster, else auto: the "
        "local rank's GPU where there is one)",
    )
    p.add_argument(
        "--dataset-url",
        dest="dataset_url",
        default=DATASET.url,
        help="where the dataset's manifest and shards are (s3://, file:// or memory://)",
    )
    p.add_argument(
        "--json", dest="json_path", metavar="PATH", help="also write the results as JSON here"
    )


def flag_error(err: ValidationError, flags: dict[str, str] = FLAGS) -> ConfigError:
    """A model's validation error as one line naming the flags (`--global-batch: ...`)."""
    parts = []
    for e in err.errors():
        field = str(e["loc"][0]) if e["loc"] else ""
        got = e.get("input")
        shown = "" if isinstance(got, (dict, list)) or got is None else f" (got {got!r})"
        message = e["msg"].removeprefix("Value error, ")
        parts.append(f"{flags.get(field, field or 'config')}: {message}{shown}")
    return ConfigError("; ".join(parts))


def cluster_of(args) -> ClusterSpec:
    """--cluster's file, --speeds' workers, or the default cluster; --device on every worker,
    --launcher and --ray-address on the cluster."""
    if args.cluster and args.speeds:
        raise ConfigError("--speeds and --cluster: give one of them, not both")
    if args.cluster:
        cluster = ClusterSpec.from_file(args.cluster)
    elif args.speeds:
        name = f"speeds-{args.speeds.replace(',', '-')}"
        cluster = ClusterSpec.from_speeds(parse_speeds(args.speeds), name=name)
    else:
        cluster = default_cluster()
    if getattr(args, "device", None):
        for w in cluster.workers:
            w.device = args.device
    launcher = getattr(args, "launcher", None)
    address = getattr(args, "ray_address", None)
    if address and (launcher or cluster.launcher) != "ray":
        raise ConfigError("--ray-address: needs --launcher ray (or launcher: ray in --cluster)")
    if launcher or address:
        try:
            cluster = ClusterSpec.model_validate(
                {
                    **cluster.model_dump(),
                    "launcher": launcher or cluster.launcher,
                    "ray_address": address or cluster.ray_address,
                }
            )
        except ValidationError as e:
            raise flag_error(e, {**FLAGS, "launcher": "--launcher"}) from None
    return cluster


def train_of(args, variant: str | None = None) -> TrainConfig:
    """TrainConfig of the flags; `variant` ('baseline' | 'optimized') sets its preset knobs."""
    knobs = {
        "steps": args.steps,
        "recipe": recipe_flag(args, BUILTIN_RECIPES),
        "recipe_options": recipe_options(args),
        "global_batch": args.global_batch,
        "seed": args.seed,
        "precision": getattr(args, "precision", TRAIN.precision),
        "strategy": getattr(args, "strategy", TRAIN.strategy),
        "allow_local_sgd": getattr(args, "allow_local_sgd", TRAIN.allow_local_sgd),
        "accumulate": getattr(args, "accumulate", TRAIN.accumulate),
        "profile_max_age_h": getattr(args, "profile_max_age_h", TRAIN.profile_max_age_h),
        "profile_first": getattr(args, "profile_first", TRAIN.profile_first),
    }
    try:
        return TrainConfig.variant(variant, **knobs) if variant else TrainConfig(**knobs)
    except ValidationError as e:
        raise flag_error(e) from None


# the dataset a built-in recipe trains on when no --dataset-url is given
RECIPE_DATASETS = {
    "gpt": {"source": "stdlib", "url": "s3://hetflow-data/stdlib", "max_mb": 4.0},
}


def dataset_of(args) -> DatasetSpec:
    """--dataset-url's dataset (written before by `hetflow data ingest`), else the recipe's
    built-in one: digits, or the standard library's source for `gpt`."""
    try:
        if args.dataset_url != DATASET.url:
            return DatasetSpec(source="existing", url=args.dataset_url)
        return DatasetSpec(**RECIPE_DATASETS.get(recipe_flag(args, BUILTIN_RECIPES), {}))
    except ValidationError as e:
        raise flag_error(e) from None


class Job(NamedTuple):
    """A job's models from its flags, and the job resolved once (`resolve_job`)."""

    cluster: ClusterSpec
    train: TrainConfig
    dataset: DatasetSpec
    resolved: ResolvedJob


def job_of(args, variant: str | None = None, compare: bool = False) -> Job:
    """The cluster, training config and dataset of a job's flags, validated together: `train`
    as it runs, or with `compare` the variants a comparison runs of it
    (`TrainConfig.compared`). The catalog knows the instance types the workers name."""
    say_alias("--recipe", recipe_flag(args, BUILTIN_RECIPES), RECIPE_ALIASES)
    cluster, train, dataset = cluster_of(args), train_of(args, variant), dataset_of(args)
    check_instance_types(cluster)  # offline for the shipped catalog's types: before torch
    configs = list(train.compared().values()) if compare else [train]
    return Job(cluster, train, dataset, resolve_job(cluster, configs))


INGEST_FLAGS = {
    "source": "--source",
    "source_url": "--from",
    "image_size": "--image-size",
    "max_mb": "--max-mb",
    "url": "--url",
    "shard_samples": "--shard-samples",
    "synthetic_samples": "--samples",
}


def add_ingest_args(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--source",
        choices=[c for c in choices(DatasetSpec, "source") if c != "existing"],
        default=DATASET.source,
        help="digits, synthetic, stdlib (Python's own source, as bytes), or your data under "
        "--from: text files, parquet files, or images in one subfolder per class",
    )
    p.add_argument("--from", dest="source_url", help="the source: a folder, file:// or s3://")
    p.add_argument("--url", "--to", dest="url", default=DATASET.url, help="where to write it")
    p.add_argument("--glob", default=DATASET.glob, help="the files to read (text, parquet)")
    p.add_argument("--columns", default="", help="parquet feature columns, comma-separated")
    p.add_argument("--label-column", dest="label_column", help="parquet label column")
    p.add_argument(
        "--image-size",
        dest="image_size",
        type=int,
        default=DATASET.image_size,
        help="side of the square each image is resized to (images)",
    )
    p.add_argument("--max-mb", dest="max_mb", type=float, help="read at most this much text")
    p.add_argument(
        "--shard-samples",
        type=int,
        dest="shard_samples",
        default=DATASET.shard_samples,
        help="samples per shard",
    )
    p.add_argument(
        "--samples",
        type=int,
        default=DATASET.synthetic_samples,
        help="how many samples the synthetic source makes",
    )


def ingest_of(args) -> DatasetSpec:
    """The DatasetSpec of `hetflow data ingest`'s flags."""
    try:
        return DatasetSpec(
            source=args.source,
            source_url=args.source_url,
            url=args.url,
            glob=args.glob,
            columns=[c.strip() for c in args.columns.split(",") if c.strip()],
            label_column=args.label_column,
            image_size=args.image_size,
            max_mb=args.max_mb,
            shard_samples=args.shard_samples,
            synthetic_samples=args.samples,
        )
    except ValidationError as e:
        raise flag_error(e, INGEST_FLAGS) from None
