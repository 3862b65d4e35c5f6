"""Users' own networks, given to fedlit by import path (``custom_backbones.TinyNet``)."""

from __future__ import annotations

import torch
from torch import Tensor, nn


class TinyNet(nn.Module):
    """Conv 3x3 + BatchNorm + ReLU, global average pooled: images (N, C, H, W) -> (N, width)."""

    def __init__(self, in_channels: int = 3, width: int = 8) -> None:
        super().__init__()
        self.conv = nn.Conv2d(in_channels, width, 3, padding=1)
        self.bn = nn.BatchNorm2d(width)

    def forward(self, x: Tensor) -> Tensor:
        return torch.relu(self.bn(self.conv(x))).mean(dim=(2, 3))


class FlatNet(nn.Module):
    """A linear layer on the flattened 32x32 RGB image: takes no other shape."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(3 * 32 * 32, 16)

    def forward(self, x: Tensor) -> Tensor:
        return self.fc(x.flatten(1))


class FlatConv(nn.Module):
    """A 3x3 convolution without padding (4 channels), flattened: images (N, C, S, S) ->
    (N, 4 (S - 2)^2), a feature size that depends on the images' side."""

    def __init__(self, in_channels: int = 1) -> None:
        super().__init__()
        self.conv = nn.Conv2d(in_channels, 4, 3)

    def forward(self, x: Tensor) -> Tensor:
        return torch.relu(self.conv(x)).flatten(1)
