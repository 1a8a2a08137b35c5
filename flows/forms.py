"""The flows' parameter types as the Prefect form shows them: the config models, with the
choices only this layer knows offered as lists (`FormChoices`): the EC2 catalog's instance
types, the built-in recipes, common gradient-communication methods. Validation is the models'
own: a value off the list (another EC2 type, your own recipe) is still accepted."""

from __future__ import annotations

import re
from typing import Annotated

from hetflow.config import BUILTIN_RECIPES, ClusterSpec, FormChoices, TrainConfig
from hetflow.infra.catalog import load_snapshot

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


def by_size(instance_type: str) -> tuple[str, float]:
    """('g5', 2.0) for 'g5.2xlarge': family, then size (xlarge = 1, metal last)."""
    family, _, size = instance_type.partition(".")
    m = re.fullmatch(r"(\d*)xlarge", size)
    return family, (float(m[1] or 1) if m else 0.5 if size == "large" else 1e3)


def catalog_types() -> tuple[str, ...]:
    """The instance types of the shipped catalog snapshot (`infra/instance_types.json`), by
    family and size."""
    return tuple(sorted(load_snapshot(), key=by_size))


Cluster = Annotated[
    ClusterSpec,
    FormChoices("workers.instance_type", catalog_types(), "catalog", other="another EC2 type"),
]
Train = Annotated[
    TrainConfig,
    FormChoices("recipe", BUILTIN_RECIPES, "built-in", other="your own (package.module:Name)"),
    FormChoices(
        "compression", COMPRESSION_CHOICES, "method", other="another (powersgd:8, topk:0.05, ...)"
    ),
]
