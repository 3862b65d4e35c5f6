"""The two CNN backbones of paper 001 (FedCon), Table I "Model architectures"."""

import torch
from torch import Tensor, nn

from fedlit.models.backbones import Backbone, check_flat_size, check_norm, make_norm


class FedConMNISTCNN(Backbone):
    """Paper 001 Table I, MNIST backbone (the classic PyTorch MNIST example net).

    Conv(10, 5x5) + MaxPool(2) + ReLU, Conv(20, 5x5) + MaxPool(2) + ReLU, flatten.
    Needs 28x28 inputs: stage maps (N, 10, 12, 12), (N, 20, 4, 4); features (N, 320).
    ``norm`` other than ``"none"`` (the paper's choice) inserts a norm after each conv.
    The paper's server-side head is FC 320x50 + ReLU, FC 50x10 (``default_head = (50,)``),
    21,840 parameters in all with 10 classes.
    """

    default_norm = "none"
    default_head = (50,)
    default_head_dropout = 0.0

    def __init__(self, in_channels: int = 1, norm: str = "none") -> None:
        super().__init__()
        check_norm(norm)
        self.in_channels = in_channels
        self.norm = norm
        self.stages = nn.ModuleList(
            [
                nn.Sequential(
                    nn.Conv2d(in_channels, 10, kernel_size=5),
                    make_norm(norm, 10),
                    nn.MaxPool2d(2),
                    nn.ReLU(inplace=True),
                ),
                nn.Sequential(
                    nn.Conv2d(10, 20, kernel_size=5),
                    make_norm(norm, 20),
                    nn.MaxPool2d(2),
                    nn.ReLU(inplace=True),
                ),
            ]
        )
        self.feature_dim = 320

    # feature_maps (Backbone): (N, C, 28, 28) -> [(N, 10, 12, 12), (N, 20, 4, 4)].

    def pool(self, last: Tensor) -> Tensor:
        """(N, 20, 4, 4) -> (N, 320) by flattening."""
        return check_flat_size("FedConMNISTCNN", torch.flatten(last, 1), self.feature_dim, "28x28")


class FedConCIFARCNN(Backbone):
    """Paper 001 Table I, CIFAR & SVHN backbone: six 3x3 convs (padding 1) in three stages.

    Stage 1: conv 32 + norm + ReLU, conv 64 + ReLU, MaxPool(2).
    Stage 2: conv 128 + norm + ReLU, conv 128 + ReLU, MaxPool(2), Dropout(``dropout``).
    Stage 3: conv 256 + norm + ReLU, conv 256 + ReLU, MaxPool(2).
    Needs 32x32 inputs: stage maps (N, 64, 16, 16), (N, 128, 8, 8), (N, 256, 4, 4);
    features (N, 4096). The paper's server-side head is FC 4096x1024, FC 1024x512 (ReLU,
    Dropout 0.1 each), FC 512x10: 5,852,170 parameters in all with BatchNorm and 10 classes.
    """

    default_norm = "bn"
    default_head = (1024, 512)
    default_head_dropout = 0.1

    def __init__(self, in_channels: int = 3, norm: str = "bn", dropout: float = 0.05) -> None:
        super().__init__()
        check_norm(norm)
        self.in_channels = in_channels
        self.norm = norm

        def block(c_in: int, c_mid: int, c_out: int) -> list[nn.Module]:
            return [
                nn.Conv2d(c_in, c_mid, kernel_size=3, padding=1),
                make_norm(norm, c_mid),
                nn.ReLU(inplace=True),
                nn.Conv2d(c_mid, c_out, kernel_size=3, padding=1),
                nn.ReLU(inplace=True),
                nn.MaxPool2d(2),
            ]

        self.stages = nn.ModuleList(
            [
                nn.Sequential(*block(in_channels, 32, 64)),
                nn.Sequential(*block(64, 128, 128), nn.Dropout(dropout)),
                nn.Sequential(*block(128, 256, 256)),
            ]
        )
        self.feature_dim = 4096

    # feature_maps (Backbone): (N, C, 32, 32) -> [(N, 64, 16, 16), (N, 128, 8, 8), (N, 256, 4, 4)].

    def pool(self, last: Tensor) -> Tensor:
        """(N, 256, 4, 4) -> (N, 4096) by flattening."""
        return check_flat_size("FedConCIFARCNN", torch.flatten(last, 1), self.feature_dim, "32x32")
