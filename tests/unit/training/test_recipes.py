"""Recipes: the built-ins build, count and evaluate; a user's recipe is one file found by its
import path (the docs' own example); a bad one is refused in one line naming the field."""

from __future__ import annotations

import math
import re
from pathlib import Path

import numpy as np
import pytest
import torch

from hetflow.config import BUILTIN_RECIPES, ConfigError, TrainConfig
from hetflow.infra.data.format import digits_source
from hetflow.training.recipes import (
    DataInfo,
    check_fits,
    check_recipe,
    eval_batches,
    evaluate,
    get_recipe,
    parameter_count,
    seeded_model,
)

README = Path(__file__).resolve().parents[3] / "docs" / "recipes.md"  # the recipe's page
TOKENS = DataInfo(kind="tokens", vocab=256)
SMALL_GPT = {"n_layer": 1, "n_head": 2, "n_embd": 32, "context": 16}


def _train(recipe, model, x, y, steps: int, lr: float, adam: bool = False) -> list[float]:
    """Mean losses of `steps` SGD (or Adam) steps on one batch (the loop's loss, one process)."""
    opt = (torch.optim.Adam if adam else torch.optim.SGD)(model.parameters(), lr=lr)
    losses = []
    for _ in range(steps):
        loss, count = recipe.loss(model, recipe.batch(x, y))
        (loss / count).backward()
        opt.step()
        opt.zero_grad()
        losses.append(loss.item() / count)
    return losses


@pytest.mark.parametrize(
    "name, params",
    [("digits-mlp", 85_002), ("digits-cnn", 151_306), ("digits-wide-mlp", 4_349_962)],
)
def test_digits_recipes_keep_the_models_they_replace(name, params):
    recipe = get_recipe(name)
    assert (recipe.name, recipe.kind) == (name, "tabular")
    assert parameter_count(seeded_model(recipe, DataInfo(), 0)) == params


def test_gpt_default_has_a_few_million_parameters_and_counts_tokens_not_padding():
    recipe = get_recipe("gpt")
    assert 2_000_000 < parameter_count(seeded_model(recipe, TOKENS, 0)) < 6_000_000
    small = get_recipe("gpt", **SMALL_GPT)
    model = seeded_model(small, TOKENS, 0)
    w = np.random.default_rng(0).integers(0, 256, size=(3, 17))
    w[0, -5:] = -1  # padding: neither predicted nor counted
    loss, count = small.loss(model, small.batch(w, np.zeros(3, dtype=np.int64)))
    assert count == 3 * 16 - 5
    # an untrained byte model is near uniform: mean loss ~ ln 256
    assert loss.item() / count == pytest.approx(math.log(256), rel=0.1)


def test_gpt_learns_a_repeating_text_and_evaluates_val_loss_and_perplexity():
    recipe = get_recipe("gpt", **SMALL_GPT)
    model = seeded_model(recipe, TOKENS, 0)
    text = np.frombuffer(b"hetflow trains on mixed hardware. " * 8, dtype=np.uint8)
    w = np.stack([text[i : i + 17] for i in range(0, 160, 16)]).astype(np.int64)
    y = np.zeros(len(w), dtype=np.int64)
    losses = _train(recipe, model, w, y, steps=30, lr=1e-2, adam=True)
    assert losses[-1] < 0.5 * losses[0]
    figures = evaluate(recipe, model, eval_batches(recipe, w, y, size=4))
    assert set(figures) == {"val_loss", "perplexity"}
    assert figures["perplexity"] == pytest.approx(math.exp(figures["val_loss"]))
    assert model.training  # evaluate leaves the model in train mode


@pytest.mark.parametrize("source", ["digits", "synthetic"])
def test_resnet_reads_uint8_images_and_learns_them(source):
    if source == "digits":  # 8x8 digits as 1x8x8 uint8 images (0..16 -> 0..255)
        x, y = digits_source(0.2, 0)["train"]
        x = (x[:32] * 15).astype(np.uint8).reshape(-1, 1, 8, 8)
        y, info = y[:32], DataInfo(kind="images", classes=10, shape=(1, 8, 8))
    else:  # two classes of 3x16x16 images: dark and bright
        rng = np.random.default_rng(0)
        y = rng.integers(0, 2, size=32)
        x = rng.integers(0, 100, size=(32, 3, 16, 16)) + 120 * y[:, None, None, None]
        x, info = x.astype(np.uint8), DataInfo(kind="images", classes=2, shape=(3, 16, 16))
    recipe = get_recipe("resnet", width=8, blocks=1)
    model = seeded_model(recipe, info, 0)
    pixels, _ = recipe.batch(x, y)
    assert pixels.dtype == torch.float32 and abs(float(pixels.mean())) < 2.0
    losses = _train(recipe, model, x, y, steps=16, lr=0.1)
    assert losses[-1] < 0.8 * losses[0]
    figures = evaluate(recipe, model, eval_batches(recipe, x, y))
    assert figures.keys() == {"accuracy", "test_loss"}
    # the test split's mean cross-entropy: the training loss's own measure, over every sample
    model.eval()
    with torch.no_grad():
        summed = sum(float(recipe.loss(model, b)[0]) for b in eval_batches(recipe, x, y))
    model.train()
    assert figures["test_loss"] == pytest.approx(summed / len(y), rel=1e-5)


def readme_recipe() -> tuple[str, str]:
    """(file name, source) of the recipe on the docs' 'Your own recipe' page."""
    section = README.read_text().split("# Your own recipe", 1)[1]
    match = re.search(r"```python\n# (\w+\.py)\n(.*?)```", section, re.S)
    return match.group(1), match.group(2)


def test_the_readmes_recipe_is_one_file_that_trains_on_digits(tmp_path, monkeypatch):
    name, source = readme_recipe()
    assert not re.search(r"\b(dist|DistributedDataParallel|mlflow|rank)\b", source)
    (tmp_path / name).write_text(source)
    monkeypatch.syspath_prepend(str(tmp_path))
    command = re.search(r"hetflow demo --recipe (\S+)", README.read_text()).group(1)
    recipe = check_recipe(TrainConfig(recipe=command))
    x, y = digits_source(0.2, 0)["train"]
    model = seeded_model(recipe, DataInfo(), 0)
    losses = _train(recipe, model, x[:128], y[:128], steps=10, lr=0.5)
    assert losses[-1] < losses[0]
    assert "accuracy" in evaluate(recipe, model, eval_batches(recipe, x, y))


BAD = {
    "does not import": ("no_such_pkg.mod:Recipe", {}, "does not import"),
    "no such class": ("hetflow.training.recipes.gpt:Nope", {}, "has no 'Nope'"),
    "not a class": ("hetflow.training.recipes.base:get_recipe", {}, "is not a class"),
    "lacks the interface": ("hetflow.training.recipes.base:Recipe", {}, "does not define"),
    "not a recipe at all": ("torch.nn:Linear", {}, "does not define"),
    "unknown option": ("gpt", {"n_layers": 2}, "train.recipe_options: gpt"),
    "bad option value": ("gpt", {"n_embd": 30, "n_head": 4}, "train.recipe_options: gpt"),
}


@pytest.mark.parametrize("path, options, said", BAD.values(), ids=BAD.keys())
def test_a_bad_recipe_is_refused_in_one_line_naming_the_field(path, options, said):
    with pytest.raises(ConfigError) as e:
        check_recipe(TrainConfig(recipe=path, recipe_options=options))
    text = str(e.value)
    assert text.startswith("train.recipe") and said in text and "\n" not in text


def test_an_image_recipe_on_token_shards_is_refused_naming_both():
    with pytest.raises(ConfigError, match=r"train.recipe: resnet reads images .* tokens"):
        check_fits(get_recipe("resnet"), TOKENS, "s3://b/text")


def test_the_prefect_form_lists_the_builtins_and_accepts_a_path():
    schema = TrainConfig.model_json_schema()["properties"]["recipe"]
    assert schema["examples"] == list(BUILTIN_RECIPES)
    assert "\n" not in schema["description"]  # one line: the names are the dropdown's
    assert re.fullmatch(schema["pattern"].split("|")[1], "my_pkg.recipes:TinyGPT")
    assert TrainConfig(recipe="my_pkg.recipes:TinyGPT").recipe == "my_pkg.recipes:TinyGPT"
