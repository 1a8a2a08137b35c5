"""The optimizer a run trains with: the one its TrainConfig names, or its recipe's own.

`TrainConfig.optimizer` is 'recipe' by default, and `lr` and `weight_decay` are empty: the
recipe says how its model trains (`Recipe.optimizer`, `Recipe.lr`, `Recipe.weight_decay`;
SGD with momentum for the classifiers, AdamW for the language model, as nanoGPT trains). A
value the config sets wins. `resolve_optimizer` fills the three fields once, before a run is
launched, so that MLflow's params and every rank see the same concrete choice.

    >>> from hetflow.config import TrainConfig
    >>> from hetflow.training.recipes import get_recipe
    >>> t = resolve_optimizer(TrainConfig(recipe="gpt"), get_recipe("gpt"))
    >>> (t.optimizer, t.lr, t.weight_decay)
    ('adamw', 0.001, 0.1)
    >>> t = resolve_optimizer(TrainConfig(recipe="gpt", optimizer="sgd"), get_recipe("gpt"))
    >>> (t.optimizer, t.lr, t.weight_decay)
    ('sgd', 0.05, 0.0)
"""

from __future__ import annotations

import torch
from torch import nn

from hetflow.config import TrainConfig

# The learning rate an optimizer gets when neither the config nor the recipe (whose optimizer
# is another) gives one: torch's Adam default, and the digits recipes' SGD rate.
USUAL_LR = {"sgd": 0.05, "adam": 1e-3, "adamw": 1e-3}


def resolve_optimizer(train: TrainConfig, recipe) -> TrainConfig:
    """`train` with `optimizer`, `lr` and `weight_decay` concrete: the config's where set; else
    the recipe's when the optimizer is the recipe's; else `USUAL_LR` and no weight decay."""
    own = train.optimizer in ("recipe", recipe.optimizer)
    name = recipe.optimizer if train.optimizer == "recipe" else train.optimizer
    lr = train.lr if train.lr is not None else (recipe.lr if own else USUAL_LR[name])
    wd = train.weight_decay
    if wd is None:
        wd = recipe.weight_decay if own else 0.0
    return train.model_copy(update={"optimizer": name, "lr": lr, "weight_decay": wd})


def build_optimizer(model: nn.Module, train: TrainConfig) -> torch.optim.Optimizer:
    """The optimizer of a resolved `train` (`resolve_optimizer`) over `model`'s parameters.
    Weight decay applies to tensors of 2 or more dimensions only (weights, embeddings), not to
    biases and norms, as nanoGPT's `configure_optimizers` does; SGD takes `momentum`."""
    if train.optimizer == "recipe" or train.lr is None or train.weight_decay is None:
        raise ValueError("build_optimizer needs a resolved TrainConfig (resolve_optimizer)")
    params = [p for p in model.parameters() if p.requires_grad]
    groups = [{"params": params, "weight_decay": 0.0}]  # one group, in the model's order
    if train.weight_decay:
        groups = [
            {"params": [p for p in params if p.dim() >= 2], "weight_decay": train.weight_decay},
            {"params": [p for p in params if p.dim() < 2], "weight_decay": 0.0},
        ]
    if train.optimizer == "sgd":
        return torch.optim.SGD(groups, lr=train.lr, momentum=train.momentum)
    if train.optimizer == "adam":
        return torch.optim.Adam(groups, lr=train.lr)
    return torch.optim.AdamW(groups, lr=train.lr)
