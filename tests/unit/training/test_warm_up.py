"""The untimed warm-up pass every variant runs before step 0 leaves no trace on the run."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import torch

from hetflow.training.devices import MixedPrecision
from hetflow.training.loop.rank_step import Stepper
from hetflow.training.recipes import DataInfo, get_recipe, seeded_model


def _warm(recipe, info, x, y):
    model = seeded_model(recipe, info, 0).train()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    stepper = Stepper(
        SimpleNamespace(model=model, device="cpu"),
        emu=None,
        mean=None,
        amp=MixedPrecision("cpu", "fp32", scaled=False),
        counter=None,
        recipe=recipe,
    )
    torch.manual_seed(5)
    stepper.warm_up(recipe.batch(x, y))
    after_rng = torch.rand(3)
    torch.manual_seed(5)
    return model, before, after_rng, torch.rand(3)


def test_warm_up_leaves_batchnorm_statistics_gradients_and_the_rng_as_they_were():
    recipe = get_recipe("resnet", width=8, norm="batch")
    info = DataInfo(kind="images", features=None, classes=10, shape=(3, 16, 16))
    x = np.random.default_rng(0).integers(0, 255, (4, 3, 16, 16), dtype=np.uint8)
    model, before, drawn, expected = _warm(recipe, info, x, np.arange(4) % 10)
    after = model.state_dict()
    assert any("running_mean" in k for k in after)  # what a forward pass in train mode moves
    assert all(torch.equal(before[k], after[k]) for k in before)
    assert all(p.grad is None for p in model.parameters())
    assert torch.equal(drawn, expected)


def test_warm_up_on_a_dropout_model_draws_nothing_from_the_run_s_generator():
    recipe = get_recipe("gpt", n_layer=1, n_head=2, n_embd=32, context=16, dropout=0.5)
    tokens = (np.arange(4 * 17) % 256).reshape(4, 17).astype(np.int64)
    model, before, drawn, expected = _warm(
        recipe, DataInfo(kind="tokens", vocab=256), tokens, tokens[:, 0]
    )
    assert torch.equal(drawn, expected)
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())
