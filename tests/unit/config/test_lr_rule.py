"""The learning rate follows the global batch (`training.loop.optim`): the recipe's rule
(square root for the digits classifiers and gpt, linear for resnet) from the batch it was tuned at,
a linear warm-up where it rises, the config's overrides, a resume that keeps the warm-up's
place, one-line errors; and gpt's larger sizes, counted on the meta device."""

from __future__ import annotations

import io

import pytest
import torch

from hetflow.config import ConfigError, TrainConfig, validated
from hetflow.training.loop.optim import (
    build_optimizer,
    build_scheduler,
    resolve_optimizer,
    step_scheduler,
)
from hetflow.training.loop.state import Checkpoint
from hetflow.training.recipes import DataInfo, Recipe, check_recipe, get_recipe, parameter_count
from hetflow.training.recipes.digits import DigitsMLP


def _lrs(train: TrainConfig, steps: int) -> list[float]:
    """The lr of each of `steps` optimizer steps of a run on `train` (resolved here)."""
    resolved = resolve_optimizer(train, get_recipe(train.recipe))
    model = torch.nn.Linear(4, 2)
    opt = build_optimizer(model, resolved)
    scheduler = build_scheduler(opt, resolved)
    out = []
    for _ in range(steps):
        out.append(opt.param_groups[0]["lr"])
        opt.step()
        step_scheduler(scheduler)
    return out


# (config, {step: lr}): the lr a step runs at
RULES = {
    # resnet: 0.05 at 128, linear: 0.2 at 512, reached by a warm-up of 10 steps from 0.05
    "linear, 4x the batch": (
        TrainConfig(recipe="resnet", global_batch=512),
        {0: 0.05, 5: 0.125, 10: 0.2, 14: 0.2},
    ),
    # digits: 0.05 at 128, square root: 0.1 at 512, over 10 steps
    "sqrt (SGD), 4x the batch": (
        TrainConfig(recipe="digits-mlp", global_batch=512),
        {0: 0.05, 5: 0.075, 10: 0.1, 14: 0.1},
    ),
    # gpt: 1e-3 at 128 windows of 128 bytes, square root: 2e-3 at 512, over 100 steps
    "sqrt, 4x the batch": (
        TrainConfig(recipe="gpt", global_batch=512),
        {0: 1e-3, 50: 1.5e-3, 100: 2e-3, 120: 2e-3},
    ),
    # a smaller batch: a smaller lr from the first step, nothing to warm up
    "linear, half the batch": (TrainConfig(recipe="resnet", global_batch=64), {0: 0.025}),
    "sqrt, a quarter of the batch": (TrainConfig(recipe="gpt", global_batch=32), {0: 5e-4}),
    # the tuned batch: the lr as it always was
    "the tuned batch": (TrainConfig(recipe="gpt", global_batch=128), {0: 1e-3, 60: 1e-3}),
    # an lr the config sets is used as given
    "none: an explicit lr": (
        TrainConfig(recipe="digits-mlp", global_batch=512, lr=0.01),
        {0: 0.01, 60: 0.01},
    ),
    # ... unless the config sets a rule too: then it is the lr at the tuned batch
    "an explicit lr and rule": (
        TrainConfig(
            recipe="digits-mlp", global_batch=512, lr=0.01, lr_scaling="sqrt", lr_warmup_steps=4
        ),
        {0: 0.01, 2: 0.015, 4: 0.02, 9: 0.02},
    ),
    "the config's tuned batch and no warm-up": (
        TrainConfig(recipe="resnet", global_batch=512, lr_tuned_batch=256, lr_warmup_steps=0),
        {0: 0.1, 9: 0.1},
    ),
}


@pytest.mark.parametrize("train, want", RULES.values(), ids=RULES.keys())
def test_the_lr_after_k_steps_follows_the_rule_and_the_warm_up(train, want):
    lrs = _lrs(train, max(want) + 1)
    assert {k: lrs[k] for k in want} == pytest.approx(want, rel=1e-9)


def test_another_optimizer_than_the_recipes_takes_its_usual_lr_unscaled():
    t = resolve_optimizer(
        TrainConfig(recipe="gpt", global_batch=512, optimizer="sgd"), get_recipe("gpt")
    )
    assert (t.lr, t.lr_scaling, t.lr_warmup_steps, t.scaled_lr()) == (0.05, "none", 0, 0.05)


def test_resolving_fills_the_rule_once_and_again_changes_nothing():
    recipe = get_recipe("resnet")
    t = resolve_optimizer(TrainConfig(recipe="resnet", global_batch=256), recipe)
    assert (t.lr_scaling, t.lr_tuned_batch, t.lr_warmup_steps) == ("linear", 128, 10)
    assert resolve_optimizer(t, recipe) == t  # the ranks resolve what the driver resolved


class Untuned(Recipe):
    """A user's recipe that states nothing of its lr: SGD at 0.05 at every batch, as before."""

    def build_model(self, info: DataInfo) -> torch.nn.Module:
        return torch.nn.Linear(info.features, info.classes)

    def loss(self, model, batch):
        x, y = batch
        return torch.nn.functional.cross_entropy(model(x.float()), y, reduction="sum"), len(y)

    def evaluate(self, model, batches):
        return {}


def test_a_recipe_without_a_tuned_batch_is_not_scaled_and_a_rule_for_it_is_refused():
    recipe = Untuned()
    t = resolve_optimizer(TrainConfig(recipe="digits-mlp", global_batch=1024), recipe)
    assert (t.lr_scaling, t.lr_tuned_batch, t.scaled_lr()) == ("none", None, 0.05)
    with pytest.raises(ConfigError) as e:
        resolve_optimizer(TrainConfig(global_batch=1024, lr_scaling="linear"), recipe)
    assert str(e.value).startswith("train.lr_scaling:") and "\n" not in str(e.value)
    given = TrainConfig(global_batch=1024, lr_scaling="linear", lr_tuned_batch=256)
    assert resolve_optimizer(given, recipe).scaled_lr() == pytest.approx(0.2)


def test_the_warm_up_resumes_where_the_checkpoint_left_it():
    """Three steps into a ten-step warm-up, through a checkpoint's dict and torch.save, into a
    new optimizer and scheduler: the lrs go on as in a run that never stopped."""
    train = TrainConfig(recipe="digits-mlp", global_batch=512, lr_warmup_steps=10)
    whole = _lrs(train, 12)
    resolved = resolve_optimizer(train, get_recipe("digits-mlp"))
    opt = build_optimizer(torch.nn.Linear(4, 2), resolved)
    scheduler = build_scheduler(opt, resolved)
    for _ in range(3):
        opt.step()
        step_scheduler(scheduler)
    ckpt = Checkpoint(
        step=3,
        workers=["w0"],
        model={},
        optimizer=opt.state_dict(),
        plan=[512],
        plans=[],
        evals=[],
        train_time_s=0.0,
        rebalancer={},
        comm=None,
        trials=None,
        scaler={},
        records=[[]],
        scheduler=scheduler.state_dict(),
    )
    buf = io.BytesIO()
    torch.save(ckpt.to_dict(), buf)  # as CheckpointStore does
    loaded = Checkpoint.from_dict(torch.load(io.BytesIO(buf.getvalue()), weights_only=True), [])
    opt = build_optimizer(torch.nn.Linear(4, 2), resolved)
    scheduler = build_scheduler(opt, resolved)  # a fresh one starts the warm-up again ...
    opt.load_state_dict(loaded.optimizer)
    scheduler.load_state_dict(loaded.scheduler)  # ... the checkpoint's goes on from step 3
    resumed = []
    for _ in range(3, 12):
        resumed.append(opt.param_groups[0]["lr"])
        opt.step()
        step_scheduler(scheduler)
    assert resumed == pytest.approx(whole[3:], rel=1e-9)


BAD_FIELDS = {
    "unknown rule": ({"lr_scaling": "cubic"}, "train.lr_scaling"),
    "negative warm-up": ({"lr_warmup_steps": -1}, "train.lr_warmup_steps"),
    "tuned batch under 1": ({"lr_tuned_batch": 0}, "train.lr_tuned_batch"),
}


@pytest.mark.parametrize("fields, named", BAD_FIELDS.values(), ids=BAD_FIELDS.keys())
def test_a_bad_lr_field_is_one_line_naming_it(fields, named):
    with pytest.raises(ConfigError) as e:
        validated(TrainConfig, fields, "train")
    assert str(e.value).startswith(named) and "\n" not in str(e.value)


class BadRule(DigitsMLP):
    lr_scaling = "cubic"


class NoBatch(DigitsMLP):
    tuned_batch = 0


class BackwardWarmUp(DigitsMLP):
    lr_warmup_steps = -5


@pytest.mark.parametrize(
    "cls, said",
    [(BadRule, "lr_scaling 'cubic'"), (NoBatch, "tuned_batch 0"), (BackwardWarmUp, "-5")],
    ids=["unknown rule", "tuned batch under 1", "negative warm-up"],
)
def test_a_recipe_with_a_bad_lr_rule_is_refused_before_launch(cls, said):
    with pytest.raises(ConfigError) as e:
        check_recipe(TrainConfig(recipe=f"{__name__}:{cls.__name__}"))
    text = str(e.value)
    assert text.startswith("train.recipe:") and said in text and "\n" not in text


def test_check_recipe_refuses_a_rule_without_a_tuned_batch_before_launch():
    with pytest.raises(ConfigError, match=r"^train\.lr_scaling:"):
        check_recipe(TrainConfig(recipe=f"{__name__}:Untuned", lr_scaling="sqrt"))


# -- gpt's sizes --------------------------------------------------------------------------------

GIB = 2**30
STATE_BYTES = 16  # fp32 weights, gradients and AdamW's two moments, per parameter


def _params_on_meta(**options) -> tuple[Recipe, int]:
    """The recipe and its model's parameter count, built on the meta device (no memory)."""
    recipe = get_recipe("gpt", **options)
    with torch.device("meta"):
        model = recipe.build_model(DataInfo(kind="tokens", vocab=256))
    return recipe, parameter_count(model)


@pytest.mark.parametrize(
    "size, low, high, fits_16gib",
    [
        ("medium", 300e6, 400e6, True),
        ("large", 600e6, 800e6, True),  # its state fits; one window's activations barely do
        ("xl", 1.1e9, 1.3e9, False),  # its state alone is over 16 GiB: it needs sharding
    ],
)
def test_gpt_sizes_have_the_parameters_and_state_their_docstring_states(
    size, low, high, fits_16gib
):
    recipe, n = _params_on_meta(size=size)
    assert low < n < high
    assert (n * STATE_BYTES < 16 * GIB) == fits_16gib
    assert recipe.context == 1024 and recipe.lr < get_recipe("gpt").lr  # larger: a smaller lr


def test_a_gpt_size_takes_option_overrides_and_its_tuned_batch_follows_the_context():
    recipe, n = _params_on_meta(size="medium", n_layer=2)
    _, whole = _params_on_meta(size="medium")
    assert recipe.n_layer == 2 and n < whole / 10
    tokens = get_recipe("gpt", size="medium").tuned_batch * 1024
    assert get_recipe("gpt", size="medium", context=512).tuned_batch * 512 == tokens
    with pytest.raises(ConfigError, match="train.recipe_options: gpt: size must be one of"):
        get_recipe("gpt", size="huge")
