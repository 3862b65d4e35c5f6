"""Self-supervised heads from lightly, sized for fedlit's backbones."""

from __future__ import annotations

from lightly.models.modules import (
    BYOLPredictionHead,
    BYOLProjectionHead,
    SimCLRProjectionHead,
    SimSiamPredictionHead,
    SimSiamProjectionHead,
)
from torch import nn

SSL_HEADS = ("simclr", "simsiam", "byol")


def ssl_heads(kind: str, feature_dim: int, dim: int) -> tuple[nn.Module, nn.Module | None]:
    """(projector, predictor) of ``kind`` on features (N, feature_dim) -> (N, dim).

    Projection and prediction are both ``dim`` wide with ``dim`` hidden units (paper 000 uses
    512 for ResNet-18); SimCLR has no predictor.
    """
    if kind == "simclr":
        return SimCLRProjectionHead(feature_dim, dim, dim), None
    if kind == "simsiam":
        return SimSiamProjectionHead(feature_dim, dim, dim), SimSiamPredictionHead(dim, dim, dim)
    if kind == "byol":
        return BYOLProjectionHead(feature_dim, dim, dim), BYOLPredictionHead(dim, dim, dim)
    raise ValueError(f"unknown SSL head kind {kind!r}; choose one of {SSL_HEADS}")
