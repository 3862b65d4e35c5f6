"""``ResNet18``: torchvision's ResNet-18 with a CIFAR stem and no classification layer."""

import torch
from torch import Tensor, nn
from torchvision.models import resnet18

from fedlit.models.backbones import Backbone, check_norm, make_norm


class ResNet18(Backbone):
    """torchvision ResNet-18 with conv1 = 3x3 stride 1 padding 1, no max-pool, no ``fc``.

    Stages are ``layer1..layer4``; on 32x32 inputs their maps are (N, 64, 32, 32),
    (N, 128, 16, 16), (N, 256, 8, 8), (N, 512, 4, 4). Global average pooling of
    ``layer4`` gives features (N, 512). ``norm`` goes to torchvision's ``norm_layer``.
    Parameter names match torchvision's ``resnet18`` (``conv1``, ``bn1``, ``layer1``...).
    """

    default_norm = "bn"

    def __init__(self, in_channels: int = 3, norm: str = "bn") -> None:
        super().__init__()
        check_norm(norm)
        self.in_channels = in_channels
        self.norm = norm

        def norm_layer(channels: int) -> nn.Module:
            return make_norm(norm, channels)

        net = resnet18(weights=None, norm_layer=norm_layer)
        conv1 = nn.Conv2d(in_channels, 64, kernel_size=3, stride=1, padding=1, bias=False)
        nn.init.kaiming_normal_(conv1.weight, mode="fan_out", nonlinearity="relu")
        self.conv1 = conv1
        self.bn1 = net.bn1
        self.relu = net.relu
        self.maxpool = nn.Identity()
        self.layer1 = net.layer1
        self.layer2 = net.layer2
        self.layer3 = net.layer3
        self.layer4 = net.layer4
        self.avgpool = net.avgpool
        self.feature_dim = 512

    def feature_maps(self, x: Tensor) -> list[Tensor]:
        """(N, C, H, W) -> outputs of layer1..layer4, (N, 64|128|256|512, H/1|2|4|8, ...)."""
        x = self.maxpool(self.relu(self.bn1(self.conv1(x))))
        maps = []
        for layer in (self.layer1, self.layer2, self.layer3, self.layer4):
            x = layer(x)
            maps.append(x)
        return maps

    def pool(self, last: Tensor) -> Tensor:
        """(N, 512, h, w) -> (N, 512) by global average pooling."""
        return torch.flatten(self.avgpool(last), 1)
