"""Residual backbones: torchvision's ResNet-18 with a CIFAR stem, and the DAWNBench ResNet-9."""

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


def _conv_block(in_channels: int, out_channels: int, norm: str, pool: bool = False) -> nn.Module:
    layers = [
        nn.Conv2d(in_channels, out_channels, kernel_size=3, padding=1, bias=False),
        make_norm(norm, out_channels),
        nn.ReLU(inplace=True),
    ]
    if pool:
        layers.append(nn.MaxPool2d(2))
    return nn.Sequential(*layers)


class _Residual(nn.Module):
    """x + f(x) for a shape-preserving f."""

    def __init__(self, body: nn.Module) -> None:
        super().__init__()
        self.body = body

    def forward(self, x: Tensor) -> Tensor:
        return x + self.body(x)


class ResNet9(Backbone):
    """The 9-layer ResNet of the DAWNBench CIFAR-10 entries (Page 2018), the backbone of
    FedMatch's CIFAR-10 protocol that paper 002 (FedSEAL) adopts.

    Stages: prep conv 64; conv 128 + max-pool + residual (2 convs 128); conv 256 + max-pool;
    conv 512 + max-pool + residual (2 convs 512). On 32x32 inputs the maps are (N, 64, 32, 32),
    (N, 128, 16, 16), (N, 256, 8, 8), (N, 512, 4, 4); global max pooling gives (N, 512)
    features (28x28 inputs give 3x3 last maps and the same features).
    """

    default_norm = "bn"

    def __init__(self, in_channels: int = 3, norm: str = "bn") -> None:
        super().__init__()
        check_norm(norm)
        self.stages = nn.Sequential(
            _conv_block(in_channels, 64, norm),
            nn.Sequential(
                _conv_block(64, 128, norm, pool=True),
                _Residual(nn.Sequential(_conv_block(128, 128, norm), _conv_block(128, 128, norm))),
            ),
            _conv_block(128, 256, norm, pool=True),
            nn.Sequential(
                _conv_block(256, 512, norm, pool=True),
                _Residual(nn.Sequential(_conv_block(512, 512, norm), _conv_block(512, 512, norm))),
            ),
        )
        self.feature_dim = 512

    def pool(self, last: Tensor) -> Tensor:
        """(N, 512, h, w) -> (N, 512) by global max pooling."""
        return torch.amax(last, dim=(2, 3))
