"""What every recipe's model has in common; the models themselves are recipes
(`hetflow.training.recipes`: digits-mlp, digits-cnn, digits-wide-mlp, gpt, resnet)."""

from __future__ import annotations

from torch import nn


def parameter_count(model: nn.Module) -> int:
    """Parameters of `model`, each shared tensor once (a tied embedding counts once)."""
    return sum(p.numel() for p in model.parameters())
