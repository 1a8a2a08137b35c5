"""The optimizer a run trains with (`hetflow.training.loop.optim`): the config's choice where it
makes one, else the recipe's own (AdamW for gpt, SGD for the classifiers); weight decay on
weight matrices only."""

from __future__ import annotations

import pytest
import torch

from hetflow.config import TrainConfig
from hetflow.training.loop.optim import build_optimizer, resolve_optimizer
from hetflow.training.recipes import DataInfo, get_recipe

CASES = {
    # (recipe, config fields) -> (optimizer, lr, weight_decay)
    "gpt's own": ("gpt", {}, ("adamw", 1e-3, 0.1)),
    "gpt, the config's lr": ("gpt", {"lr": 3e-4}, ("adamw", 3e-4, 0.1)),
    "gpt, named as its own": (
        "gpt",
        {"optimizer": "adamw", "weight_decay": 0.0},
        ("adamw", 1e-3, 0.0),
    ),
    "gpt on sgd": ("gpt", {"optimizer": "sgd"}, ("sgd", 0.05, 0.0)),
    "digits' own": ("digits-cnn", {}, ("sgd", 0.05, 0.0)),
    "digits on adam": ("digits-cnn", {"optimizer": "adam"}, ("adam", 1e-3, 0.0)),
    "resnet's own, lr set": ("resnet", {"lr": 0.1}, ("sgd", 0.1, 0.0)),
}


@pytest.mark.parametrize("recipe, fields, want", CASES.values(), ids=CASES.keys())
def test_the_config_wins_where_set_else_the_recipe_where_it_is_its_optimizer(recipe, fields, want):
    train = resolve_optimizer(TrainConfig(recipe=recipe, **fields), get_recipe(recipe))
    assert (train.optimizer, train.lr, train.weight_decay) == want
    again = resolve_optimizer(train, get_recipe(recipe))
    assert again == train  # idempotent: the ranks resolve what the driver already resolved


def test_adamw_decays_the_weight_matrices_not_biases_or_norms():
    recipe = get_recipe("gpt", n_layer=1, n_head=2, n_embd=16, context=8)
    model = recipe.build_model(DataInfo(vocab=256))
    opt = build_optimizer(model, resolve_optimizer(TrainConfig(recipe="gpt"), recipe))
    assert isinstance(opt, torch.optim.AdamW)
    decay = {id(p): g["weight_decay"] for g in opt.param_groups for p in g["params"]}
    assert len(decay) == len(list(model.parameters()))
    for name, p in model.named_parameters():
        assert decay[id(p)] == (0.1 if p.dim() >= 2 else 0.0), name
    assert any(decay[id(p)] == 0.0 for n, p in model.named_parameters() if "ln" in n)


def test_sgd_without_decay_is_one_group_in_the_models_order():
    """What the classifiers trained with before recipes chose: SGD(lr 0.05, momentum 0.9) over
    the parameters in order, so that their checkpoints and figures are unchanged."""
    recipe = get_recipe("digits-mlp")
    model = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.Linear(3, 2))
    opt = build_optimizer(model, resolve_optimizer(TrainConfig(recipe="digits-mlp"), recipe))
    assert isinstance(opt, torch.optim.SGD) and len(opt.param_groups) == 1
    group = opt.param_groups[0]
    assert group["params"] == list(model.parameters())
    assert (group["lr"], group["momentum"], group["weight_decay"]) == (0.05, 0.9, 0.0)


def test_an_unresolved_config_is_refused():
    with pytest.raises(ValueError, match="resolve_optimizer"):
        build_optimizer(torch.nn.Linear(2, 2), TrainConfig())
