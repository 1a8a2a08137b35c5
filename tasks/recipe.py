"""The checks of a job's recipe and devices that the flows run before anything launches."""

from __future__ import annotations

from hetflow.config import ClusterSpec, TrainConfig
from hetflow.infra.data.format import Manifest
from hetflow.training.devices import check_devices
from hetflow.training.recipes import check_recipe


def check_train_recipe(train: TrainConfig, manifest: Manifest | None = None) -> None:
    """The recipe `train` names imports, has what a Recipe needs, and reads what `manifest`
    (if given) holds; a one-line ConfigError naming `train.recipe` otherwise."""
    check_recipe(train, manifest)


def check_train_devices(cluster: ClusterSpec, train: TrainConfig) -> None:
    """Every worker's device and precision can be had on this host (`check_devices`); a
    one-line ConfigError naming the worker's field otherwise (`device: cuda` where there is no
    CUDA, `bf16` on a GPU without it)."""
    check_devices(cluster, train)
