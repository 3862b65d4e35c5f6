"""``SmallCNN``: a three-stage CNN that trains in seconds on a CPU (28x28 or 32x32 inputs)."""

import torch
from torch import Tensor, nn

from fedlit.models.backbones import Backbone, check_norm, make_norm


class SmallCNN(Backbone):
    """Three stages of conv3x3 (padding 1) + norm + ReLU, channels (w, 2w, 4w).

    Stages 1 and 2 end with ``MaxPool2d(2)``; global average pooling of stage 3 gives
    ``feature_dim = 4 * width``. Any input size >= 4x4 works: on 28x28 the stage maps are
    14x14, 7x7, 7x7; on 32x32 they are 16x16, 8x8, 8x8.
    """

    default_norm = "bn"

    def __init__(self, in_channels: int = 1, norm: str = "bn", width: int = 32) -> None:
        super().__init__()
        check_norm(norm)
        self.in_channels = in_channels
        self.norm = norm
        self.width = width
        channels = (width, 2 * width, 4 * width)
        stages: list[nn.Module] = []
        previous = in_channels
        for index, out in enumerate(channels):
            layers: list[nn.Module] = [
                nn.Conv2d(previous, out, kernel_size=3, padding=1),
                make_norm(norm, out),
                nn.ReLU(inplace=True),
            ]
            if index < 2:
                layers.append(nn.MaxPool2d(2))
            stages.append(nn.Sequential(*layers))
            previous = out
        self.stages = nn.ModuleList(stages)
        self.avgpool = nn.AdaptiveAvgPool2d(1)
        self.feature_dim = channels[-1]

    # feature_maps (Backbone): (N, C, H, W) -> (N, w, H/2, W/2), (N, 2w, H/4, W/4), (N, 4w, ...)

    def pool(self, last: Tensor) -> Tensor:
        """(N, 4w, h, w) -> (N, 4w) by global average pooling."""
        return torch.flatten(self.avgpool(last), 1)
