"""Classifiers of tabular samples, e.g. scikit-learn's 8x8 digits (64 features, 10 classes):
`digits-mlp` (85k parameters), `digits-cnn` (151k, the demo's) and `digits-wide-mlp` (4.3M,
enough for communication to matter)."""

from __future__ import annotations

import numpy as np
import torch
from torch import nn

from hetflow.training.recipes.base import DataInfo, Recipe


class Classifier(Recipe):
    """Cross-entropy summed over the batch's samples (count: samples); evaluates accuracy.

    SGD with momentum at lr 0.05 for a global batch of 128 (the config's default batch, which
    the demo and its measurements train at), scaled by the square root of the global batch's
    ratio to it (Krizhevsky 2014, "One weird trick"; Hoffer et al. 2017), rising to it over 10
    steps where that raises it. Not Goyal et al. 2017's linear rule: on digits-cnn at 8x the
    batch, its lr of 0.4 diverged in 3 runs of 3, and at 4x its warm-up did worse than none;
    the square root with 10 warm-up steps did best at 4x (`hetflow bench lr_rule`,
    docs/measurements/recipes.md). `resnet` keeps Goyal's rule.
    """

    kind = "tabular"
    count_per_sample = 1
    tuned_batch, lr_scaling, lr_warmup_steps = 128, "sqrt", 10

    def batch(self, x: np.ndarray, y: np.ndarray) -> tuple[torch.Tensor, torch.Tensor]:
        return torch.as_tensor(x, dtype=torch.float32), torch.as_tensor(y).long()

    def loss(self, model: nn.Module, batch: tuple[torch.Tensor, ...]) -> tuple[torch.Tensor, int]:
        x, y = batch
        return nn.functional.cross_entropy(model(x), y, reduction="sum"), len(y)

    def evaluate(self, model: nn.Module, batches) -> dict[str, float]:
        """Accuracy on the test split, and its mean cross-entropy (`test_loss`): a quality
        that moves with every sample, where accuracy moves by one test sample's share."""
        right = seen = 0
        loss = 0.0
        for x, y in batches:
            out = model(x)
            right += int((out.argmax(1) == y).sum())
            loss += float(nn.functional.cross_entropy(out, y, reduction="sum"))
            seen += len(y)
        return {"accuracy": right / max(seen, 1), "test_loss": loss / max(seen, 1)}


def _mlp(features: int, hidden: int, classes: int) -> nn.Module:
    return nn.Sequential(
        nn.Linear(features, hidden),
        nn.ReLU(),
        nn.Linear(hidden, hidden),
        nn.ReLU(),
        nn.Linear(hidden, classes),
    )


class DigitsMLP(Classifier):
    """Two hidden layers of `hidden` units (256: 85k parameters on digits)."""

    def __init__(self, hidden: int = 256) -> None:
        self.hidden = int(hidden)

    def build_model(self, info: DataInfo) -> nn.Module:
        return _mlp(info.features, self.hidden, info.classes)


class DigitsWideMLP(DigitsMLP):
    """Two hidden layers of 2048 units: 4.3M parameters, for communication studies."""

    def __init__(self, hidden: int = 2048) -> None:
        super().__init__(hidden)


class DigitsCNN(Classifier):
    """Two 3x3 convolutions and a max-pool over the square image the features make."""

    def check_data(self, info: DataInfo) -> None:
        """The features must make a square image (8 x 8 for digits)."""
        side = round(info.features**0.5)
        if side * side != info.features:
            raise ValueError(f"digits-cnn needs a square number of features, not {info.features}")

    def build_model(self, info: DataInfo) -> nn.Module:
        self.check_data(info)
        side = round(info.features**0.5)
        return nn.Sequential(
            nn.Unflatten(1, (1, side, side)),
            nn.Conv2d(1, 32, 3, padding=1),
            nn.ReLU(),
            nn.Conv2d(32, 64, 3, padding=1),
            nn.ReLU(),
            nn.MaxPool2d(2),
            nn.Flatten(),
            nn.Linear(64 * (side // 2) ** 2, 128),
            nn.ReLU(),
            nn.Linear(128, info.classes),
        )
