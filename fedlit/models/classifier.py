"""``Classifier`` (backbone + MLP head), the backbone registry and ``build_classifier``."""

from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import Tensor, nn

from fedlit.models.any_backbone import (
    DOWNLOAD,
    TIMM,
    TORCHVISION,
    load_weights,
    read_weights,
    wrap_module,
)
from fedlit.models.backbones import Backbone, check_norm
from fedlit.models.fedcon_cnn import FedConCIFARCNN, FedConMNISTCNN
from fedlit.models.resnet import ResNet9, ResNet18
from fedlit.models.small_cnn import SmallCNN

BACKBONES: dict[str, type[Backbone]] = {
    "small_cnn": SmallCNN,
    "fedcon_mnist_cnn": FedConMNISTCNN,
    "fedcon_cifar_cnn": FedConCIFARCNN,
    "resnet18": ResNet18,
    "resnet9": ResNet9,
}
"""fedlit's own values of ``model.network.backbone`` and the classes they build (beside them:
``torchvision/<name>``, ``timm/<name>``, an import path or a module, see
:mod:`fedlit.models.any_backbone`)."""


def make_head(
    in_features: int, num_classes: int, hidden: Sequence[int] = (), dropout: float = 0.0
) -> nn.Sequential:
    """MLP (N, in_features) -> logits (N, num_classes).

    Each hidden size adds Linear + ReLU + Dropout(``dropout``) (the Dropout is kept at
    ``dropout = 0`` so parameter names depend only on ``hidden``); then a last Linear.
    """
    layers: list[nn.Module] = []
    previous = in_features
    for size in hidden:
        layers += [nn.Linear(previous, size), nn.ReLU(inplace=True), nn.Dropout(dropout)]
        previous = size
    layers.append(nn.Linear(previous, num_classes))
    return nn.Sequential(*layers)


class Classifier(nn.Module):
    """Backbone + head: images (N, C, H, W) -> logits (N, num_classes), no softmax; and, for
    the representation objectives, optional projector and predictor heads on the features.

    ``state_dict`` keys are ``backbone.*``, ``head.*`` and, where set, ``projector.*`` and
    ``predictor.*``, so methods can average the backbone alone.
    """

    backbone: Backbone
    head: nn.Sequential
    #: features (N, feature_dim) -> projections (N, dim); set by the methods that need one.
    projector: nn.Module | None
    #: projections (N, dim) -> predictions (N, dim) (SimSiam, BYOL, FedSup).
    predictor: nn.Module | None

    def __init__(
        self,
        backbone: Backbone,
        num_classes: int,
        hidden: Sequence[int] = (),
        dropout: float = 0.0,
    ) -> None:
        super().__init__()
        self.backbone = backbone
        self.head = make_head(backbone.feature_dim, num_classes, hidden, dropout)
        self.num_classes = num_classes
        self.projector = None
        self.predictor = None

    def forward(self, x: Tensor) -> Tensor:
        """Images (N, C, H, W) -> logits (N, num_classes)."""
        return self.head(self.backbone(x))

    def projection(self, features: Tensor) -> Tensor:
        """Features (N, feature_dim) -> the projector's (N, dim)."""
        if self.projector is None:
            raise ValueError("this network has no projector head")
        return self.projector(features)

    def prediction(self, z: Tensor) -> Tensor:
        """Projections (N, dim) -> the predictor's (N, dim)."""
        if self.predictor is None:
            raise ValueError("this network has no predictor head")
        return self.predictor(z)


def build_classifier(
    backbone: str | nn.Module,
    num_classes: int,
    in_channels: int,
    norm: str | None = None,
    head: Sequence[int] | None = None,
    head_dropout: float | None = None,
    image_size: int | None = None,
    weights: str | None = None,
) -> Classifier:
    """Build ``backbone`` and its head into a ``Classifier``.

    ``backbone``: a name of :data:`BACKBONES`, ``torchvision/<name>``, ``timm/<name>``, a
    dotted import path or an ``nn.Module`` (:mod:`fedlit.models.any_backbone`).
    ``norm=None`` keeps the backbone's default norm; ``head=None`` its ``default_head``
    (paper 001 Table I for the FedCon CNNs, none otherwise); ``head_dropout=None`` its
    ``default_head_dropout`` (0.1 for the FedCon CIFAR CNN, 0.0 otherwise). ``image_size``:
    the side of the data's images, where known (a wrapped network's feature dimension is found
    by a forward at it; else at 32). ``weights``: a state-dict file of the backbone as its
    source builds it, or ``"download"`` (torchvision's and timm's own weights; needs a network).
    Raises ``ValueError`` naming ``model.network.backbone``, ``model.network.norm`` or
    ``model.network.backbone_weights``.

    The network's 4-d weights are stored channels-last (NHWC), the layout the loaders give
    their images in: convolutions run about 1.3x faster on a CPU (oneDNN) and use the tensor
    cores' layout on a GPU. Values, ``state_dict`` keys and shapes are unchanged.
    """
    encoder = build_backbone(backbone, in_channels, norm, image_size, weights)
    hidden = encoder.default_head if head is None else tuple(head)
    dropout = encoder.default_head_dropout if head_dropout is None else head_dropout
    network = Classifier(encoder, num_classes, hidden, dropout)
    return network.to(memory_format=torch.channels_last)


def build_backbone(
    backbone: str | nn.Module,
    in_channels: int,
    norm: str | None = None,
    image_size: int | None = None,
    weights: str | None = None,
) -> Backbone:
    """The encoder ``backbone`` names (see :func:`build_classifier`), images -> features."""
    if isinstance(backbone, str) and backbone in BACKBONES:
        cls = BACKBONES[backbone]
        if weights == DOWNLOAD:
            raise ValueError(
                f"model.network.backbone_weights={DOWNLOAD!r}: only torchvision/ and timm/ "
                f"backbones download weights; {backbone!r} takes a file's path"
            )
        if norm is None:
            encoder = cls(in_channels=in_channels)
        else:
            encoder = cls(in_channels=in_channels, norm=check_norm(norm))
        if weights is not None:
            load_weights(encoder, read_weights(weights), weights, repr(backbone))
        return encoder
    external = isinstance(backbone, nn.Module) or backbone.startswith((TORCHVISION, TIMM))
    if not external and "." not in str(backbone):
        allowed = ", ".join(repr(name) for name in BACKBONES)
        raise ValueError(
            f"model.network.backbone: unknown backbone {backbone!r}; choose one of {allowed}, "
            f"{TORCHVISION}<name>, {TIMM}<name> or a class's import path (package.module.Class)"
        )
    return wrap_module(backbone, in_channels, norm, image_size, weights)


@dataclass(frozen=True)
class Architecture:
    """The network's settings (a recipe's ``model.init_args.network``): the one network a
    method builds, on the server and on its clients alike.

    Args:
        num_classes: classes of the data set (linked from ``data.num_classes`` by the CLI).
        in_channels: image channels (linked from ``data.in_channels``).
        backbone: a name from :data:`BACKBONES`, ``torchvision/<name>``, ``timm/<name>``, a
            class's import path, or an ``nn.Module`` (in YAML: ``class_path``/``init_args``),
            images -> features (:mod:`fedlit.models.any_backbone`). A module starts the run
            with the weights it holds (copied at each build; it is not changed).
        norm: "bn", "gn" or "none"; None keeps the backbone's own. On a network fedlit does
            not build itself, "gn" and "none" replace its BatchNorm2d layers.
        image_size: the side of the data's images (linked from the data by the CLI); None:
            unknown until the data are loaded. The backbone must take images of this size.
        backbone_weights: pretrained weights of the backbone: a state-dict file of the
            network as its source builds it, read with ``torch.load(weights_only=True)``, or
            ``download`` (torchvision's ``DEFAULT`` / timm's pretrained weights; needs a
            network). Only the server's initial networks load them; clients receive them.
    """

    num_classes: int
    in_channels: int
    backbone: str | nn.Module = "small_cnn"
    norm: str | None = None
    image_size: int | None = None
    backbone_weights: str | None = None

    def build(self, pretrained: bool = False) -> Classifier:
        """A freshly initialised network (its initial weights drawn from torch's generator),
        its backbone holding :attr:`backbone_weights` if ``pretrained``."""
        return build_classifier(
            self.backbone,
            self.num_classes,
            self.in_channels,
            self.norm,
            image_size=self.image_size,
            weights=self.backbone_weights if pretrained else None,
        )
