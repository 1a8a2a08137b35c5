"""The check of a job's recipe that the flows run before anything launches."""

from __future__ import annotations

from hetflow.config import TrainConfig
from hetflow.infra.datasets import Manifest
from hetflow.training.recipes import check_recipe


def check_train_recipe(train: TrainConfig, manifest: Manifest | None = None) -> None:
    """The recipe `train` names imports, has what a Recipe needs, and reads what `manifest`
    (if given) holds; a one-line ConfigError naming `train.recipe` otherwise."""
    check_recipe(train, manifest)
