"""The models the simulator and `hetflow recommend` reason about, as figures: parameters, FLOPs
per sample, data (pure, no torch: the local models' figures are counted by hand; tests check
them against `hetflow.training.recipes`).
"""

from __future__ import annotations

import dataclasses
import itertools
from dataclasses import dataclass

from hetflow.forecast.simulate.memory import GIB, per_sample_bytes


@dataclass(frozen=True)
class ModelSpec:
    """A model as the simulator sees it: its gradient, its FLOPs and its data.

    `per_sample_flops` is training FLOPs per sample (forward + backward ~ 3 x forward);
    `sample_bytes` what one sample weighs in storage; `epoch_samples` one pass over the data;
    `sample_memory_bytes` what one sample of a local batch takes in a device's memory while
    training, mixed precision (`simulate.memory`; None: not known), from `memory_source`.
    """

    name: str
    params: int
    per_sample_flops: float
    sample_bytes: float
    epoch_samples: int
    default_local_batch: int | None = None
    default_global_batch: int | None = None
    source: str = ""
    sample_memory_bytes: float | None = None
    memory_source: str = ""

    @property
    def grad_bytes(self) -> float:
        return 4.0 * self.params  # fp32 gradients; compression is a Network knob


def _linear(i: int, o: int) -> tuple[int, int]:
    """(parameters, forward FLOPs per sample) of nn.Linear(i, o)."""
    return i * o + o, 2 * i * o


def _local_models() -> dict[str, ModelSpec]:
    # the digits recipes' models (hetflow.training.recipes.digits) on 8x8 digits, counted by
    # hand (importing torch here would make the simulator slow to import; tests check the
    # counts against the recipes).
    digits = {
        "sample_bytes": 64 * 4 + 8,
        "epoch_samples": 1437,
        "default_global_batch": 128,
        "source": "hetflow.training.recipes.digits on scikit-learn digits (1437 training samples)",
    }
    out = {}
    for name, widths in {"mlp": (64, 256, 256, 10), "wide_mlp": (64, 2048, 2048, 10)}.items():
        layers = [_linear(i, o) for i, o in itertools.pairwise(widths)]
        out[name] = ModelSpec(
            name, sum(p for p, _ in layers), 3.0 * sum(f for _, f in layers), **digits
        )
    conv1 = (1 * 32 * 9 + 32, 2 * 8 * 8 * 32 * 9)
    conv2 = (32 * 64 * 9 + 64, 2 * 8 * 8 * 64 * 32 * 9)
    fc1, fc2 = _linear(64 * 16, 128), _linear(128, 10)
    layers = [conv1, conv2, fc1, fc2]
    out["cnn"] = ModelSpec(
        "cnn", sum(p for p, _ in layers), 3.0 * sum(f for _, f in layers), **digits
    )
    # the recipes' names (TrainConfig.recipe, a profile's `model` since recipes); the short
    # names are those of profiles stored before (OLD_NAMES)
    for old, new in OLD_NAMES.items():
        out[new] = dataclasses.replace(out[old], name=new)
    return out


_DLE = "NVIDIA DeepLearningExamples"

# The digits models' names before they were recipes: still accepted (a profile stored then
# names its model so), never listed.
OLD_NAMES = {"mlp": "digits-mlp", "cnn": "digits-cnn", "wide_mlp": "digits-wide-mlp"}


MODELS: dict[str, ModelSpec] = {
    # ResNet-50: 25.6M parameters, 4.1 GFLOP forward per 224x224 image (He et al. 2016 count
    # 3.8-4.1 G multiply-adds; 4.1 GFLOP is the figure the field quotes), training ~ 3 x forward.
    # ImageNet-1k: 1,281,167 training images, ~110 KB each as JPEG.
    "resnet50": ModelSpec(
        "resnet50",
        25_600_000,
        3 * 4.1e9,
        110e3,
        1_281_167,
        default_local_batch=64,
        source="He et al. 2016; ImageNet-1k train split",
        # NVIDIA trains ResNet-50 v1.5 at local batch 256 under mixed precision on a 16 GB V100
        sample_memory_bytes=per_sample_bytes(16 * GIB, 256, 25_600_000),
        memory_source=f"{_DLE} PyTorch/Classification/ConvNets/configs.yml @097c7ff9: local "
        "batch 256, mixed precision, on a 16 GB V100",
    ),
    # BERT-Large: 340M parameters; forward ~ 2 FLOPs per parameter per token at sequence length
    # 128 -> 2 x 340e6 x 128 = 87 GFLOP, training ~ 3 x forward. An epoch: ~3.3B words of
    # BooksCorpus + English Wikipedia at ~1.3 tokens per word in 128-token sequences ~ 33.5M
    # sequences; a sample is 128 token ids + masks (~1.5 KB).
    "bert-large": ModelSpec(
        "bert-large",
        340_000_000,
        3 * 2 * 340e6 * 128,
        1.5e3,
        33_500_000,
        default_local_batch=32,
        source="Devlin et al. 2019",
        # NVIDIA pre-trains it at local batch 16 (sequence length 128, mixed precision) on a
        # 16 GB V100
        sample_memory_bytes=per_sample_bytes(16 * GIB, 16, 340_000_000),
        memory_source=f"{_DLE} PyTorch/LanguageModeling/BERT/README.md @23a6382c: pre-training "
        "at local batch 16, sequence length 128, mixed precision, on a 16 GB V100 (DGX-1)",
    ),
    **_local_models(),
}
# The models a user is offered (`hetflow recommend --recipe`, the recommend form): each once,
# by its recipe's name.
NAMES = tuple(name for name in MODELS if name not in OLD_NAMES)
