"""A trained model as MLflow logs it: rebuilt from the recipe with the weights rank 0 saved,
and the input example its signature is inferred from."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch
from torch import nn

from hetflow.training.recipes.base import DataInfo, Recipe, seeded_model


def input_example(recipe: Recipe, info: DataInfo) -> np.ndarray:
    """Two zero samples of the dataset's kind through `recipe.batch` (its first tensor). Two,
    not one: torch.export fixes a batch dimension of size 1, and the logged model would then
    take one sample at a time (see MLflowTracker.log_model).

    >>> from hetflow.training.recipes import get_recipe
    >>> input_example(get_recipe("digits-mlp"), DataInfo()).shape
    (2, 64)
    """
    if info.kind == "tokens":
        x = np.zeros((2, recipe.context + 1), dtype=np.int64)
    elif info.kind == "images":
        x = np.zeros((2, *info.shape), dtype=np.uint8)
    else:
        x = np.zeros((2, info.features or 64), dtype=np.float32)
    return recipe.batch(x, np.zeros(2, dtype=np.int64))[0].numpy()


def trained_model(run_dir: str | Path, recipe: Recipe, info: DataInfo) -> nn.Module | None:
    """The model the ranks saved in `run_dir/model.pt`, in eval mode; None if there is none."""
    state = Path(run_dir) / "model.pt"
    if not state.exists():
        return None
    model = seeded_model(recipe, info, 0)
    model.load_state_dict(torch.load(state))
    return model.eval()
