"""The optimizer a run trains with: the one its TrainConfig names, or its recipe's own, at a
learning rate that follows the global batch.

`TrainConfig.optimizer` is 'recipe' by default, and `lr` and `weight_decay` are empty: the
recipe says how its model trains (`Recipe.optimizer`, `Recipe.lr`, `Recipe.weight_decay`;
SGD with momentum for the classifiers, AdamW for the language model, as nanoGPT trains). A
value the config sets wins. `resolve_optimizer` fills those fields and the learning-rate rule
(`lr_scaling`, `lr_tuned_batch`, `lr_warmup_steps`) once, before a run is launched, so that
MLflow's params and every rank see the same concrete choice.

The rule: `train.lr` is the rate at `lr_tuned_batch` (the recipe's `tuned_batch`), and the run
trains at `TrainConfig.scaled_lr()` = lr x (global_batch / tuned) for 'linear', x its square
root for 'sqrt', x 1 for 'none'. The recipe's rule applies to the recipe's own lr; an lr the
config sets, or another optimizer's usual one, is used as given ('none') unless the config
sets `lr_scaling` too. Where the scaled lr is above the tuned one, it rises linearly from the
tuned lr to it over `lr_warmup_steps` (`build_scheduler`: Goyal et al. 2017's gradual warm-up).
The re-balancer changes local batches, never the global one, so the rule is applied once, at
the start.

    >>> from hetflow.config import TrainConfig
    >>> from hetflow.training.recipes import get_recipe
    >>> t = resolve_optimizer(TrainConfig(recipe="gpt"), get_recipe("gpt"))
    >>> (t.optimizer, t.lr, t.weight_decay, t.lr_scaling, t.lr_tuned_batch)
    ('adamw', 0.001, 0.1, 'sqrt', 128)
    >>> t = resolve_optimizer(TrainConfig(recipe="gpt", optimizer="sgd"), get_recipe("gpt"))
    >>> (t.optimizer, t.lr, t.weight_decay, t.lr_scaling)
    ('sgd', 0.05, 0.0, 'none')
    >>> t = resolve_optimizer(TrainConfig(global_batch=512), get_recipe("resnet"))
    >>> (t.lr, t.lr_scaling, t.lr_tuned_batch, t.scaled_lr())
    (0.05, 'linear', 128, 0.2)
"""

from __future__ import annotations

import warnings

import torch
from torch import nn
from torch.optim.lr_scheduler import LinearLR

from hetflow.config import ConfigError, TrainConfig

# The learning rate an optimizer gets when neither the config nor the recipe (whose optimizer
# is another) gives one: torch's Adam default, and the digits recipes' SGD rate.
USUAL_LR = {"sgd": 0.05, "adam": 1e-3, "adamw": 1e-3}


def resolve_optimizer(train: TrainConfig, recipe) -> TrainConfig:
    """`train` with `optimizer`, `lr`, `weight_decay` and the learning-rate rule concrete: the
    config's where set; else the recipe's when the optimizer is the recipe's; else `USUAL_LR`,
    no weight decay and no scaling. Idempotent. A one-line ConfigError naming
    `train.lr_scaling` where a rule is set but no tuned batch is known."""
    own = train.optimizer in ("recipe", recipe.optimizer)
    name = recipe.optimizer if train.optimizer == "recipe" else train.optimizer
    lr = train.lr if train.lr is not None else (recipe.lr if own else USUAL_LR[name])
    wd = train.weight_decay
    if wd is None:
        wd = recipe.weight_decay if own else 0.0
    rule = train.lr_scaling
    if rule is None:  # the recipe's rule for the recipe's own lr; any other lr as given
        rule = recipe.lr_scaling if own and train.lr is None else "none"
    tuned = train.lr_tuned_batch if train.lr_tuned_batch is not None else recipe.tuned_batch
    if rule != "none" and tuned is None:
        raise ConfigError(
            f"train.lr_scaling: {rule!r} needs the global batch the lr was tuned at, and "
            f"recipe {recipe.name or train.recipe} states none; set train.lr_tuned_batch"
        )
    warmup = train.lr_warmup_steps
    if warmup is None:
        warmup = recipe.lr_warmup_steps if rule != "none" else 0
    update = {"optimizer": name, "lr": lr, "weight_decay": wd, "lr_scaling": rule}
    update |= {"lr_tuned_batch": tuned, "lr_warmup_steps": warmup}
    return train.model_copy(update=update)


def is_resolved(train: TrainConfig) -> bool:
    """Whether `resolve_optimizer` has filled `train`'s optimizer and learning-rate rule."""
    concrete = (train.lr, train.weight_decay, train.lr_scaling, train.lr_warmup_steps)
    return train.optimizer != "recipe" and None not in concrete


def build_optimizer(model: nn.Module, train: TrainConfig) -> torch.optim.Optimizer:
    """The optimizer of a resolved `train` (`resolve_optimizer`) over `model`'s parameters.
    Weight decay applies to tensors of 2 or more dimensions only (weights, embeddings), not to
    biases and norms, as nanoGPT's `configure_optimizers` does; SGD takes `momentum`. Its lr
    is the scaled one (`TrainConfig.scaled_lr`); `build_scheduler` warms up to it."""
    if not is_resolved(train):
        raise ValueError("build_optimizer needs a resolved TrainConfig (resolve_optimizer)")
    lr = train.scaled_lr()
    params = [p for p in model.parameters() if p.requires_grad]
    groups = [{"params": params, "weight_decay": 0.0}]  # one group, in the model's order
    if train.weight_decay:
        groups = [
            {"params": [p for p in params if p.dim() >= 2], "weight_decay": train.weight_decay},
            {"params": [p for p in params if p.dim() < 2], "weight_decay": 0.0},
        ]
    if train.optimizer == "sgd":
        return torch.optim.SGD(groups, lr=lr, momentum=train.momentum)
    if train.optimizer == "adam":
        return torch.optim.Adam(groups, lr=lr)
    return torch.optim.AdamW(groups, lr=lr)


def build_scheduler(opt: torch.optim.Optimizer, train: TrainConfig) -> LinearLR:
    """torch's `LinearLR` over `opt` (built by `build_optimizer`, at `train.scaled_lr()`): the
    lr starts at the tuned lr (`train.lr`) where the scaled one is above it, and rises linearly
    to the scaled lr over `lr_warmup_steps`, then stays (Goyal et al. 2017, section 2.2); a
    constant factor of 1 otherwise. Stepped once per loop step on every rank (`step_scheduler`),
    so its position is the number of steps run; a checkpoint keeps its `state_dict`."""
    scaled = train.scaled_lr()
    start = min(1.0, train.lr / scaled) if train.lr_warmup_steps else 1.0
    return LinearLR(opt, start_factor=start, end_factor=1.0, total_iters=train.lr_warmup_steps)


def step_scheduler(scheduler: LinearLR) -> None:
    """`scheduler.step()`, after a loop step, on every rank alike: a rank the plan left out of
    a step, or a step the loss scale skipped, still counts it. torch warns when the first call
    comes before any `optimizer.step()` (such a rank): expected here, and silenced."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=r"Detected call of `lr_scheduler\.step\(\)`")
        scheduler.step()
