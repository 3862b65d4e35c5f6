"""FedAvg + SimCLR / SimSiam / BYOL (paper 000, 3.2.2-3.2.4 and Algorithm 1).

The server trains the aggregated network (backbone + classifier head) with CE on its labeled set
and broadcasts it; each client trains backbone + SSL heads on two strong views of its images with
the SSL loss; backbones and heads are averaged with FedAvg weights n_k. The classifier head is
trained, and stays, at the server. As in paper 000's Algorithm 1 the server trains before
broadcasting and fine-tunes the aggregate right after aggregation
(:data:`~fedlit.methods.plan.SERVER_FIRST_AND_FINETUNE`); the fine-tuned model is the one scored,
and the last round's encoder is also judged by the finetune / linear protocols
(``federation.final_eval``).
"""

from __future__ import annotations

import math
from typing import Any, ClassVar

from fedlit.data.client import ClientData
from fedlit.methods.base import DEFAULT_OPTIMIZATION, FederatedMethod, Payload
from fedlit.methods.plan import SERVER_FIRST_AND_FINETUNE, RoundPlan
from fedlit.models import Classifier, ssl_heads
from fedlit.objectives import BYOL, Objective, Optimization, SimCLR, SimSiam


def default_proj_dim(backbone: str, feature_dim: int) -> int:
    """512 for ResNet-18 (paper 000); the backbone's feature width for the smaller CNNs."""
    return 512 if backbone == "resnet18" else feature_dim


class FedAvgSSL(FederatedMethod):
    """Base of the FedAvg + SSL baselines.

    Args:
        proj_dim: projection (and prediction) width; None: :func:`default_proj_dim`.
        The others: see :class:`FederatedMethod`.
    """

    ssl_kind: ClassVar[str]
    client_views = ("strong", "strong")

    def __init__(
        self,
        num_classes: int,
        in_channels: int,
        backbone: str = "small_cnn",
        norm: str | None = None,
        optim: Optimization = DEFAULT_OPTIMIZATION,
        proj_dim: int | None = None,
    ) -> None:
        if proj_dim is not None and proj_dim < 1:
            raise ValueError(f"model.proj_dim must be positive, got {proj_dim}")
        self.proj_dim = proj_dim  # before the base class builds the network
        super().__init__(num_classes, in_channels, backbone, norm, optim)

    def round_plan(self) -> RoundPlan:
        return SERVER_FIRST_AND_FINETUNE

    def new_network(self) -> Classifier:
        network = super().new_network()
        feature_dim = network.backbone.feature_dim
        dim = self.proj_dim or default_proj_dim(self.backbone_name, feature_dim)
        projector, predictor = ssl_heads(self.ssl_kind, feature_dim, dim)
        network.projector = projector
        if predictor is not None:
            network.predictor = predictor
        return network

    def is_shared(self, key: str) -> bool:
        return not key.startswith("head.")

    def ssl_objective(self, network: Classifier, kw: dict[str, Any]) -> Objective:
        raise NotImplementedError

    def client_objective(self, payload: Payload, client: ClientData, state: Any) -> Objective:
        return self.ssl_objective(self.client_model(payload), self.client_kwargs())


class FedAvgSimCLR(FedAvgSSL):
    """FedAvg-SimCLR: NT-Xent on clients (paper 000 eq 3.3).

    Args:
        temperature: NT-Xent temperature (0.5 in paper 000).
        The others: see :class:`FedAvgSSL`.
    """

    ssl_kind = "simclr"

    def __init__(
        self,
        num_classes: int,
        in_channels: int,
        backbone: str = "small_cnn",
        norm: str | None = None,
        optim: Optimization = DEFAULT_OPTIMIZATION,
        proj_dim: int | None = None,
        temperature: float = 0.5,
    ) -> None:
        if not (math.isfinite(temperature) and temperature > 0):
            raise ValueError(f"model.temperature must be finite and > 0, got {temperature}")
        super().__init__(num_classes, in_channels, backbone, norm, optim, proj_dim)
        self.temperature = temperature

    def ssl_objective(self, network: Classifier, kw: dict[str, Any]) -> Objective:
        return SimCLR(network, temperature=self.temperature, **kw)


class FedAvgSimSiam(FedAvgSSL):
    """FedAvg-SimSiam: symmetrised negative cosine with stop-gradient (paper 000 eq 3.6)."""

    ssl_kind = "simsiam"

    def ssl_objective(self, network: Classifier, kw: dict[str, Any]) -> Objective:
        return SimSiam(network, **kw)


class FedAvgBYOL(FedAvgSSL):
    """FedAvg-BYOL: SimSiam's loss against an EMA target that lives only during local training.

    Args:
        byol_momentum: the EMA's starting momentum, raised to 1 by a cosine schedule.
        The others: see :class:`FedAvgSSL`.
    """

    ssl_kind = "byol"

    def __init__(
        self,
        num_classes: int,
        in_channels: int,
        backbone: str = "small_cnn",
        norm: str | None = None,
        optim: Optimization = DEFAULT_OPTIMIZATION,
        proj_dim: int | None = None,
        byol_momentum: float = 0.99,
    ) -> None:
        if not 0 <= byol_momentum <= 1:
            raise ValueError(f"model.byol_momentum must be in [0, 1], got {byol_momentum}")
        super().__init__(num_classes, in_channels, backbone, norm, optim, proj_dim)
        self.byol_momentum = byol_momentum

    def ssl_objective(self, network: Classifier, kw: dict[str, Any]) -> Objective:
        return BYOL(network, ema_momentum=self.byol_momentum, **kw)
