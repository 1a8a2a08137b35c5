"""The flows' parameter types as the Prefect form shows them: what a person chooses for one
run (`FormFields`: about a dozen fields a form), the cluster and the dataset picked by name
among the saved blocks (`hetflow.flows.blocks`), and the choices only this layer knows
offered as lists (`FormChoices`): the EC2 catalog's instance types, the built-in recipes,
common gradient-communication methods. Validation is the models' own: a value off the list
(another EC2 type, your own recipe) is still accepted, and so is every field the form leaves
out, from the deployment's parameters (prefect.yaml)."""

from __future__ import annotations

from typing import Annotated

from pydantic import Field

from hetflow.config import BUILTIN_RECIPES, FormChoices, FormFields, TrainConfig
from hetflow.config.queue import QueueJob
from hetflow.flows.blocks import (  # noqa: F401 (by_size, catalog_types: re-exported)
    ClusterParam,
    DatasetParam,
    by_size,
    catalog_types,
)

# What the form lists for `train.compression`: every method, at a usual argument; any other
# argument (powersgd:8, topk:0.05) is typed in.
COMPRESSION_CHOICES = (
    "none",
    "auto",
    "fp16",
    "bf16",
    "powersgd:4",
    "topk:0.01",
    "localsgd:4",
    "hierarchical:4",
)


def titled(title: str, description: str) -> Field:
    """A top-level flow parameter's title and one-line description in its form (Prefect
    titles a parameter by its name and merges only this dict into its schema):
    `switch_s: Annotated[float, titled("Cost of a move (s)", "...")] = 15.0`."""
    return Field(json_schema_extra={"title": title, "description": description})


# The cluster and the dataset: a saved block picked by name; a mapping (a cluster file, the
# deployment's parameters) or a config model works too. The flow gets the plain model.
Cluster = Annotated[
    ClusterParam,
    titled("Cluster", "A saved ClusterSpec block (Blocks to add one); none: the flow's default."),
]
Dataset = Annotated[
    DatasetParam,
    titled("Dataset", "A saved DatasetSpec block (Blocks to add one); none: digits."),
]
RECIPES = FormChoices("recipe", BUILTIN_RECIPES, "built-in", other="your own (package.module:Name)")
COMPRESSIONS = FormChoices(
    "compression", COMPRESSION_CHOICES, "method", other="another (powersgd:8, topk:0.05, ...)"
)


# What a person chooses for one training run (the train form): the model and its steps, how
# the batch is shared, how gradients travel, the target, the seed.
TRAIN_FIELDS = (
    "recipe",
    "steps",
    "global_batch",
    "schedule",
    "compression",
    "strategy",
    "target_accuracy",
    "seed",
)
# A comparison fixes each variant's schedule and compression (`TrainConfig.compared`).
COMPARE_FIELDS = (
    "recipe",
    "steps",
    "global_batch",
    "strategy",
    "target_accuracy",
    "allow_local_sgd",
    "seed",
)
Train = Annotated[
    TrainConfig,
    RECIPES,
    COMPRESSIONS,
    FormFields(*TRAIN_FIELDS),
    titled("Training run", "What to train and how the batch is shared."),
]
Compared = Annotated[
    TrainConfig,
    RECIPES,
    FormFields(*COMPARE_FIELDS),
    titled(
        "Training run",
        "What both variants train; baseline: equal split, no compression; optimized: "
        "re-balanced, 'auto' compression.",
    ),
]
# One job of the queue form: the rest (its arrival) from the deployment's parameters or
# `hetflow queue submit`.
QUEUE_JOB_FIELDS = (
    "name",
    "priority",
    "recipe",
    "steps",
    "global_batch",
    "checkpoint_every",
    "memory_gb",
)
Job = Annotated[QueueJob, RECIPES, FormFields(*QUEUE_JOB_FIELDS)]
