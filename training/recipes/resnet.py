"""`resnet`: a residual image classifier (He et al.'s CIFAR ResNet: three stages of basic
blocks, widths w, 2w, 4w, global average pooling), written in torch because torchvision does
not install beside the CPU build of torch here. Reads uint8 images (B, C, H, W) and normalizes
them in `batch`; the default (width 16, 2 blocks per stage) is ResNet-14, 0.17M parameters.

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

import numpy as np
import torch
from torch import nn
from torch.nn import functional as F

from hetflow.training.recipes.base import DataInfo
from hetflow.training.recipes.digits import Classifier


class BasicBlock(nn.Module):
    """Two 3x3 convolutions with batch norm, and the shortcut (a 1x1 convolution where the
    block changes width or stride)."""

    def __init__(self, cin: int, cout: int, stride: int) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(cin, cout, 3, stride=stride, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(cout)
        self.conv2 = nn.Conv2d(cout, cout, 3, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(cout)
        self.shortcut = nn.Identity()
        if stride != 1 or cin != cout:
            self.shortcut = nn.Sequential(
                nn.Conv2d(cin, cout, 1, stride=stride, bias=False), nn.BatchNorm2d(cout)
            )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = F.relu(self.bn1(self.conv1(x)))
        return F.relu(self.bn2(self.conv2(out)) + self.shortcut(x))


def resnet(channels: int, classes: int, width: int, blocks: int) -> nn.Module:
    layers: list[nn.Module] = [
        nn.Conv2d(channels, width, 3, padding=1, bias=False),
        nn.BatchNorm2d(width),
        nn.ReLU(),
    ]
    cin = width
    for stage in range(3):
        cout = width * 2**stage
        for b in range(blocks):
            layers.append(BasicBlock(cin, cout, 2 if stage and b == 0 else 1))
            cin = cout
    layers += [nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(cin, classes)]
    return nn.Sequential(*layers)


class ResNet(Classifier):
    """Options: width (channels of the first stage), blocks (basic blocks per stage)."""

    kind = "images"

    def __init__(self, width: int = 16, blocks: int = 2) -> None:
        self.width, self.blocks = int(width), int(blocks)
        if min(self.width, self.blocks) < 1:
            raise TypeError("width and blocks must be >= 1")

    def build_model(self, info: DataInfo) -> nn.Module:
        channels = info.shape[0] if info.shape else 3
        return resnet(channels, info.classes, self.width, self.blocks)

    def batch(self, x: np.ndarray, y: np.ndarray) -> tuple[torch.Tensor, torch.Tensor]:
        """uint8 pixels -> floats with mean about 0 and deviation about 1."""
        pixels = torch.from_numpy(np.ascontiguousarray(x)).float()
        return (pixels / 255.0 - 0.5) / 0.25, torch.from_numpy(np.asarray(y)).long()
