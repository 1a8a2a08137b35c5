"""The recipe interface: what a user writes to train their own model with hetflow.

A recipe is one class in one file: how to build the model from what the dataset holds, how to
turn a batch of decoded samples into tensors, its SUMMED loss and the count that sum is over
(samples, or tokens for a language model), and how to evaluate. It knows nothing of ranks, DDP
or MLflow: the training loop weights each rank's sum so that the all-reduced gradient is the
gradient of the mean over the global batch's counts, and puts the model in eval mode under
`torch.no_grad()` around `evaluate`.

    >>> from hetflow.training.recipes import get_recipe
    >>> r = get_recipe("digits-mlp")
    >>> (r.name, r.kind)
    ('digits-mlp', 'tabular')
    >>> try:
    ...     get_recipe("no_such_module:Thing")
    ... except ConfigError as e:
    ...     print(e)
    train.recipe: 'no_such_module:Thing' does not import (No module named 'no_such_module')
"""

from __future__ import annotations

import importlib
import inspect
from collections.abc import Iterable
from dataclasses import dataclass

import numpy as np
import torch
from torch import nn

from hetflow.config import BUILTIN_RECIPES, LR_RULES, ConfigError

KINDS = ("tabular", "tokens", "images")
REQUIRED = ("build_model", "loss", "evaluate")  # what a recipe must define itself


@dataclass(frozen=True)
class DataInfo:
    """What the dataset's manifest says about its samples, for `Recipe.build_model`.

    `features` (tabular: floats per sample), `classes` (labels 0..classes-1), `shape`
    ([C, H, W] of an image), `vocab` (token ids 0..vocab-1); a field the kind lacks is None.
    """

    kind: str = "tabular"
    features: int | None = 64
    classes: int | None = 10
    shape: tuple[int, int, int] | None = None
    vocab: int | None = None

    @classmethod
    def from_manifest(cls, manifest) -> DataInfo:
        """The manifest's kind and sizes (`kind`, `shape` and `vocab` where the manifest
        has them; an older manifest is tabular)."""
        shape = getattr(manifest, "shape", None)
        return cls(
            kind=getattr(manifest, "kind", "tabular") or "tabular",
            features=getattr(manifest, "features", None),
            classes=getattr(manifest, "classes", None),
            shape=tuple(shape) if shape else None,
            vocab=getattr(manifest, "vocab", None),
        )


class Recipe:
    """Subclass it; define `kind`, `build_model`, `loss` and `evaluate` (and `batch` when the
    default, `torch.from_numpy` of x and y, does not fit). Options are `__init__` keyword
    arguments (`TrainConfig.recipe_options`), e.g. `def __init__(self, width: int = 64)`.

    A step's samples arrive as numpy: tabular x (B, F) float32; images x (B, C, H, W) uint8;
    tokens x (B, context + 1) int64 windows (targets x[:, 1:]); y int64 labels (zeros for
    tokens); `batch`'s tensors keep the samples on their first dimension (a share run as
    micro-batches, `train.accumulate`, is split along it). `loss` returns (the loss SUMMED
    over what it counts, that count as an int);
    set `count_per_sample` when that count is the same for every sample, which spares the
    ranks a collective per step.
    """

    name: str = ""
    kind: str = "tabular"  # the manifest kind it reads: "tabular" | "tokens" | "images"
    context: int | None = None  # tokens per training window (token recipes only)
    # What `loss` counts per sample when that is the same for every sample (1: a classifier;
    # the context: full token windows); None when it varies (padding, masks), and the ranks
    # then all-reduce their counts every step.
    count_per_sample: int | None = None
    # How the model trains unless the TrainConfig says otherwise (hetflow.training.loop.optim):
    # "sgd" (with the config's momentum), "adam" or "adamw"; weight decay on weight matrices.
    optimizer: str = "sgd"
    lr: float = 0.05
    weight_decay: float = 0.0
    # The global batch `lr` was tuned at, and how it follows another (`hetflow.config.LR_RULES`:
    # "linear", "sqrt" or "none"), rising to it over `lr_warmup_steps` where it grows
    # (training.loop.optim). None: no tuned batch, the lr is used as it is at every batch.
    tuned_batch: int | None = None
    lr_scaling: str = "none"
    lr_warmup_steps: int = 0

    def build_model(self, info: DataInfo) -> nn.Module:
        raise NotImplementedError

    def check_data(self, info: DataInfo) -> None:
        """Raise a ValueError of one line when the dataset's sizes (`info`, of the recipe's
        `kind`) do not fit the model, e.g. features that make no square image. hetflow calls
        it before anything launches (`check_fits`), so a misfit is refused in one line naming
        `train.recipe` rather than on every rank; by default every size fits."""

    def batch(self, x: np.ndarray, y: np.ndarray) -> tuple[torch.Tensor, ...]:
        return torch.from_numpy(np.ascontiguousarray(x)), torch.from_numpy(np.asarray(y))

    def loss(self, model: nn.Module, batch: tuple[torch.Tensor, ...]) -> tuple[torch.Tensor, int]:
        raise NotImplementedError

    def evaluate(
        self, model: nn.Module, batches: Iterable[tuple[torch.Tensor, ...]]
    ) -> dict[str, float]:
        raise NotImplementedError

    def shard_units(self, model: nn.Module) -> list[nn.Module]:
        """The submodules `train.strategy: fsdp` shards one by one (each gathered whole only
        for its own forward and backward), before the root, which takes the rest: by default
        the top-level children. Override where children share parameters (tied weights go to
        the root) or a deeper unit fits better (a transformer's blocks)."""
        return list(model.children())


def get_recipe(name_or_path: str, **options) -> Recipe:
    """The recipe a built-in name (`BUILTIN_RECIPES`) or an import path `package.module:Name`
    names, made with `options`; a one-line ConfigError naming `train.recipe` (or
    `train.recipe_options`) when it does not import, lacks what the interface needs, or
    does not take an option."""
    path = BUILTIN_RECIPES.get(name_or_path, name_or_path)
    cls = _import(name_or_path, path)
    _check_interface(name_or_path, cls)
    try:
        recipe = cls(**options)
    except (TypeError, ValueError) as e:
        raise ConfigError(f"train.recipe_options: {name_or_path}: {e}") from None
    recipe.name = name_or_path
    _check_lr_rule(name_or_path, recipe)
    if recipe.kind == "tokens" and not (isinstance(recipe.context, int) and recipe.context > 0):
        raise ConfigError(f"train.recipe: {name_or_path} reads tokens but has no context > 0")
    return recipe


def _import(name: str, path: str) -> type:
    module, sep, attr = path.partition(":")
    if not sep or not module or not attr:
        builtins = ", ".join(BUILTIN_RECIPES)
        raise ConfigError(
            f"train.recipe: unknown recipe {name!r}; choose one of {builtins}, "
            "or give an import path package.module:Name"
        )
    try:
        found = getattr(importlib.import_module(module), attr)
    except ImportError as e:
        raise ConfigError(f"train.recipe: {name!r} does not import ({e})") from None
    except AttributeError:
        raise ConfigError(f"train.recipe: module {module!r} has no {attr!r}") from None
    if not inspect.isclass(found):
        raise ConfigError(f"train.recipe: {name!r} is not a class")
    return found


def _check_interface(name: str, cls: type) -> None:
    missing = [
        m
        for m in REQUIRED
        if not callable(getattr(cls, m, None)) or getattr(cls, m) is getattr(Recipe, m)
    ]
    if not callable(getattr(cls, "batch", None)):
        missing.append("batch")
    if missing:
        raise ConfigError(f"train.recipe: {name!r} does not define {', '.join(missing)}")
    if getattr(cls, "kind", None) not in KINDS:
        raise ConfigError(
            f"train.recipe: {name!r} has kind {getattr(cls, 'kind', None)!r}; "
            f"expected one of {', '.join(KINDS)}"
        )


def _check_lr_rule(name: str, recipe: Recipe) -> None:
    """A one-line ConfigError naming `train.recipe` where the recipe's learning-rate rule is
    not one: an unknown rule, a tuned batch under 1, a negative warm-up."""
    tuned, rule, warmup = recipe.tuned_batch, recipe.lr_scaling, recipe.lr_warmup_steps
    if rule not in LR_RULES:
        raise ConfigError(
            f"train.recipe: {name} has lr_scaling {rule!r}; expected one of {', '.join(LR_RULES)}"
        )
    if tuned is not None and not (isinstance(tuned, int) and tuned >= 1):
        raise ConfigError(f"train.recipe: {name} has tuned_batch {tuned!r}; expected an int >= 1")
    if not (isinstance(warmup, int) and warmup >= 0):
        raise ConfigError(
            f"train.recipe: {name} has lr_warmup_steps {warmup!r}; expected an int >= 0"
        )


def check_fits(recipe: Recipe, info: DataInfo, where: str = "the dataset") -> None:
    """A one-line ConfigError naming `train.recipe` when `info`'s samples are not what
    `recipe` reads: another kind, or sizes its `check_data` refuses; the latter names the
    built-in recipes that fit `info` (`fitting_recipes`)."""
    if recipe.kind != info.kind:
        raise ConfigError(
            f"train.recipe: {recipe.name} reads {recipe.kind} samples, but {where} holds "
            f"{info.kind} samples"
        )
    try:
        recipe.check_data(info)
    except ValueError as e:
        fits = fitting_recipes(info)
        hint = f"; use --recipe {' or '.join(fits)}" if fits else ""
        raise ConfigError(f"train.recipe: {e} ({where}){hint}") from None


def fitting_recipes(info: DataInfo) -> list[str]:
    """The built-in recipes (default options) that read `info`'s kind and whose `check_data`
    takes its sizes, in `BUILTIN_RECIPES`' order.

    >>> fitting_recipes(DataInfo(kind="tabular", features=5, classes=3))
    ['digits-mlp', 'digits-wide-mlp']
    """
    fits = []
    for name in BUILTIN_RECIPES:
        recipe = get_recipe(name)
        if recipe.kind != info.kind:
            continue
        try:
            recipe.check_data(info)
        except ValueError:
            continue
        fits.append(name)
    return fits


def seeded_model(recipe: Recipe, info: DataInfo, seed: int) -> nn.Module:
    """`recipe.build_model(info)` with torch seeded first: the same initial weights on every
    rank and in every variant for a given seed. A rank reseeds after it (`seed_rank`)."""
    torch.manual_seed(seed)
    return recipe.build_model(info)


def rank_seed(seed: int, rank: int) -> int:
    """The seed of rank `rank`'s torch generators once its model is built: numpy's
    `SeedSequence` of (seed, rank), so that no two ranks of a run share it and none restarts
    the stream its initial weights were drawn from (as seed + rank would on rank 0).

    >>> rank_seed(0, 0) != rank_seed(0, 1) and rank_seed(0, 1) == rank_seed(0, 1)
    True
    """
    entropy = [seed % 2**64, rank]  # SeedSequence takes no negative seed
    return int(np.random.SeedSequence(entropy).generate_state(1, np.uint64)[0])


def seed_rank(seed: int, rank: int) -> None:
    """Seed torch's generators, CPU and every CUDA device's, for what rank `rank` draws after
    its model is built (`seeded_model`): dropout masks and any other randomness in training.

    Contract: ranks start from the same weights (the seed's, which DDP broadcasts as well),
    then each draws its own masks; the same (seed, rank) draws the same masks in every run.
    Seeded with the run's seed alone, every rank would draw the same masks (sample i of each
    rank's batch losing the same units): noise repeated across the global batch, not drawn.
    """
    torch.manual_seed(rank_seed(seed, rank))  # seeds every CUDA device too


def evaluate(
    recipe: Recipe, model: nn.Module, batches: Iterable[tuple[torch.Tensor, ...]]
) -> dict[str, float]:
    """`recipe.evaluate` in eval mode, without gradients; the model is left in train mode."""
    model.eval()
    try:
        with torch.no_grad():
            return {k: float(v) for k, v in recipe.evaluate(model, batches).items()}
    finally:
        model.train()


def eval_batches(recipe: Recipe, x: np.ndarray, y: np.ndarray, size: int = 512) -> list[tuple]:
    """A split's samples as `recipe.batch` tensors, `size` samples at a time."""
    return [recipe.batch(x[i : i + size], y[i : i + size]) for i in range(0, len(x), size)]


def parameter_count(model: nn.Module) -> int:
    """Parameters of `model`, each shared tensor once (a tied embedding counts once)."""
    return sum(p.numel() for p in model.parameters())
