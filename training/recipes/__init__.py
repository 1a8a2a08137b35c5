"""Recipes: the user's model and loss, named in `TrainConfig.recipe` (docs/architecture.md).

A built-in name (`hetflow.config.BUILTIN_RECIPES`: digits-mlp, digits-cnn, digits-wide-mlp,
gpt, resnet) or an import path `package.module:Name` to a `Recipe` subclass; `get_recipe`
resolves either, and `check_recipe` does so for a TrainConfig before anything launches.
"""

from __future__ import annotations

from hetflow.config import TrainConfig
from hetflow.training.loop.optim import resolve_optimizer
from hetflow.training.recipes.base import (
    DataInfo,
    Recipe,
    check_fits,
    eval_batches,
    evaluate,
    get_recipe,
    parameter_count,
    rank_seed,
    seed_rank,
    seeded_model,
)

__all__ = [
    "DataInfo",
    "Recipe",
    "check_fits",
    "check_recipe",
    "eval_batches",
    "evaluate",
    "get_recipe",
    "parameter_count",
    "rank_seed",
    "recipe_of",
    "seed_rank",
    "seeded_model",
]


def recipe_of(train: TrainConfig) -> Recipe:
    """The recipe `train` names, with its options."""
    return get_recipe(train.recipe, **train.recipe_options)


def check_recipe(train: TrainConfig, manifest=None) -> Recipe:
    """`recipe_of(train)`, that the dataset's `manifest` (if given) holds what it reads, and
    that its learning-rate rule resolves (`resolve_optimizer`); a one-line ConfigError naming
    `train.recipe` (or `train.lr_scaling`) otherwise. Call it before launching."""
    recipe = recipe_of(train)
    resolve_optimizer(train, recipe)
    if manifest is not None:
        check_fits(
            recipe, DataInfo.from_manifest(manifest), getattr(manifest, "url", "the dataset")
        )
    return recipe
