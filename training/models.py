"""Models for 8x8 digits (64 features, 10 classes). They know nothing of ranks."""

from __future__ import annotations

import torch
from torch import nn

MODELS = ("mlp", "cnn", "wide_mlp")


def build_model(name: str, features: int = 64, classes: int = 10, seed: int = 0) -> nn.Module:
    """The same initial weights on every rank and in every variant for a given seed."""
    torch.manual_seed(seed)
    if name == "mlp":
        return nn.Sequential(
            nn.Linear(features, 256),
            nn.ReLU(),
            nn.Linear(256, 256),
            nn.ReLU(),
            nn.Linear(256, classes),
        )
    if name == "wide_mlp":  # ~4.3M parameters: enough for communication to matter
        return nn.Sequential(
            nn.Linear(features, 2048),
            nn.ReLU(),
            nn.Linear(2048, 2048),
            nn.ReLU(),
            nn.Linear(2048, classes),
        )
    if name == "cnn":
        side = int(features**0.5)
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
            nn.Linear(128, classes),
        )
    raise ValueError(f"train.model: unknown model {name!r}; choose one of {', '.join(MODELS)}")


def parameter_count(model: nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())
