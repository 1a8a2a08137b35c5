"""`resnet`: a residual image classifier (He et al.'s CIFAR ResNet: three stages of basic
blocks, widths w, 2w, 4w, global average pooling), written in torch because torchvision does
not install beside the CPU build of torch here. Reads uint8 images (B, C, H, W) and normalizes
them in `batch`; the default (width 16, 2 blocks per stage) is ResNet-14, 0.17M parameters.

Its normalization is GroupNorm (Wu and He, 2018) by default: a sample's output does not depend
on the other samples of its batch, so ranks holding unequal shares of a global batch all-reduce
exactly the gradient of one process on the whole batch (`tests/unit/training/test_recipe_ddp.py`).
BatchNorm (`norm="batch"`) normalizes over each rank's own local batch, whose size the planner
varies per worker, so its gradient is not that of the global batch, and a worker with a batch of 1
or 0 has no usable statistics; it is there for comparison only.

    >>> import numpy as np
    >>> from hetflow.training.recipes import get_recipe
    >>> r = get_recipe("resnet", width=4, blocks=1)
    >>> model = r.build_model(DataInfo(kind="images", classes=10, shape=(3, 16, 16)))
    >>> x = np.zeros((2, 3, 16, 16), dtype=np.uint8)
    >>> loss, count = r.loss(model, r.batch(x, np.array([1, 2])))
    >>> count
    2
"""

from __future__ import annotations

import math

import numpy as np
import torch
from torch import nn
from torch.nn import functional as F

from hetflow.training.recipes.base import DataInfo
from hetflow.training.recipes.digits import Classifier

NORMS = ("group", "batch")
GROUPS = 8  # GroupNorm's groups (fewer where a layer has fewer channels)


def norm_layer(kind: str, channels: int) -> nn.Module:
    """The normalization after a convolution: GroupNorm (per sample) or BatchNorm (per batch)."""
    if kind == "batch":
        return nn.BatchNorm2d(channels)
    return nn.GroupNorm(math.gcd(GROUPS, channels), channels)


class BasicBlock(nn.Module):
    """Two 3x3 convolutions, each normalized (`norm_layer`), and the shortcut (a 1x1
    convolution where the block changes width or stride)."""

    def __init__(self, cin: int, cout: int, stride: int, norm: str = "group") -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(cin, cout, 3, stride=stride, padding=1, bias=False)
        self.bn1 = norm_layer(norm, cout)
        self.conv2 = nn.Conv2d(cout, cout, 3, padding=1, bias=False)
        self.bn2 = norm_layer(norm, cout)
        self.shortcut = nn.Identity()
        if stride != 1 or cin != cout:
            self.shortcut = nn.Sequential(
                nn.Conv2d(cin, cout, 1, stride=stride, bias=False), norm_layer(norm, cout)
            )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = F.relu(self.bn1(self.conv1(x)))
        return F.relu(self.bn2(self.conv2(out)) + self.shortcut(x))


def resnet(channels: int, classes: int, width: int, blocks: int, norm: str = "group") -> nn.Module:
    layers: list[nn.Module] = [
        nn.Conv2d(channels, width, 3, padding=1, bias=False),
        norm_layer(norm, width),
        nn.ReLU(),
    ]
    cin = width
    for stage in range(3):
        cout = width * 2**stage
        for b in range(blocks):
            layers.append(BasicBlock(cin, cout, 2 if stage and b == 0 else 1, norm))
            cin = cout
    layers += [nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(cin, classes)]
    return nn.Sequential(*layers)


class ResNet(Classifier):
    """Options: width (channels of the first stage), blocks (basic blocks per stage), norm
    ('group', exact across unequal local batches, or 'batch'; see the module's docstring)."""

    kind = "images"
    # Goyal et al. 2017 ("Accurate, Large Minibatch SGD", sections 2.1-2.2): for ResNets
    # trained with SGD, the lr grows linearly with the batch (0.05 at 128 is their 0.1 per 256),
    # after a gradual warm-up. Not measured on this recipe here (`hetflow bench lr_rule` reads
    # digits); on digits-cnn the linear rule diverged at 8x the batch (digits.Classifier).
    lr_scaling, lr_warmup_steps = "linear", 10

    def __init__(self, width: int = 16, blocks: int = 2, norm: str = "group") -> None:
        self.width, self.blocks, self.norm = int(width), int(blocks), str(norm)
        if min(self.width, self.blocks) < 1:
            raise TypeError("width and blocks must be >= 1")
        if self.norm not in NORMS:
            raise TypeError(f"norm must be one of {', '.join(NORMS)}, not {norm!r}")

    def build_model(self, info: DataInfo) -> nn.Module:
        channels = info.shape[0] if info.shape else 3
        return resnet(channels, info.classes, self.width, self.blocks, self.norm)

    def batch(self, x: np.ndarray, y: np.ndarray) -> tuple[torch.Tensor, torch.Tensor]:
        """uint8 pixels -> floats with mean about 0 and deviation about 1."""
        pixels = torch.from_numpy(np.ascontiguousarray(x)).float()
        return (pixels / 255.0 - 0.5) / 0.25, torch.from_numpy(np.asarray(y)).long()
