"""Models: backbones (images -> features) and classifiers (backbone + MLP head -> logits)."""

from fedlit.models.any_backbone import (
    DOWNLOAD,
    ModuleBackbone,
    adapt_input_channels,
    check_input_fits,
    describe,
    has_stages,
    strip_classifier,
)
from fedlit.models.backbones import NORMS, Backbone, make_norm
from fedlit.models.classifier import (
    BACKBONES,
    Architecture,
    Classifier,
    build_backbone,
    build_classifier,
    make_head,
)
from fedlit.models.fedcon_cnn import FedConCIFARCNN, FedConMNISTCNN
from fedlit.models.heads import SSL_HEADS, ssl_heads
from fedlit.models.resnet import ResNet9, ResNet18
from fedlit.models.small_cnn import SmallCNN

__all__ = [
    "BACKBONES",
    "DOWNLOAD",
    "NORMS",
    "SSL_HEADS",
    "Architecture",
    "Backbone",
    "Classifier",
    "FedConCIFARCNN",
    "FedConMNISTCNN",
    "ModuleBackbone",
    "ResNet9",
    "ResNet18",
    "SmallCNN",
    "adapt_input_channels",
    "build_backbone",
    "build_classifier",
    "check_input_fits",
    "describe",
    "has_stages",
    "make_head",
    "make_norm",
    "ssl_heads",
    "strip_classifier",
]
