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
from dataclasses import dataclass, fields
from typing import Any, ClassVar

from torch import nn

from fedlit.methods.base import DEFAULT_OPTIMIZATION, FederatedMethod
from fedlit.methods.client_side import Architecture, ClientSide, ObjectiveClientSide
from fedlit.methods.plan import SERVER_FIRST_AND_FINETUNE, RoundPlan
from fedlit.models import Classifier, ssl_heads
from fedlit.objectives import BYOL, Objective, Optimization, SimCLR, SimSiam
from fedlit.search_space import CLIENT_SPACE


def default_proj_dim(backbone: str | nn.Module, feature_dim: int) -> int:
    """512 for ResNet-18 (paper 000); the backbone's feature width for the smaller CNNs."""
    return 512 if backbone == "resnet18" else feature_dim


@dataclass(frozen=True)
class SSLArchitecture(Architecture):
    """The classifier with an SSL method's projector (and predictor) heads."""

    ssl_kind: str = "byol"  # "simclr", "simsiam" or "byol": which heads
    proj_dim: int | None = None  # the heads' width; None: default_proj_dim

    def build(self, pretrained: bool = False) -> Classifier:
        network = super().build(pretrained)
        feature_dim = network.backbone.feature_dim
        dim = self.proj_dim or default_proj_dim(self.backbone, feature_dim)
        projector, predictor = ssl_heads(self.ssl_kind, feature_dim, dim)
        network.projector = projector
        if predictor is not None:
            network.predictor = predictor
        return network


class FedAvgSSL(FederatedMethod):
    """Base of the FedAvg + SSL baselines.

    Args:
        proj_dim: projection (and prediction) width; None: :func:`default_proj_dim`.
        The others: see :class:`FederatedMethod`.
    """

    search_space = CLIENT_SPACE

    ssl_kind: ClassVar[str]
    #: The clients' objective class.
    ssl_objective: ClassVar[type[Objective]]

    def __init__(
        self,
        network: Architecture,
        optim: Optimization = DEFAULT_OPTIMIZATION,
        proj_dim: int | None = None,
    ) -> None:
        if proj_dim is not None and proj_dim < 1:
            raise ValueError(f"model.proj_dim must be positive, got {proj_dim}")
        self.proj_dim = proj_dim  # before the base class builds the network
        super().__init__(network, optim)

    def round_plan(self) -> RoundPlan:
        return SERVER_FIRST_AND_FINETUNE

    def architecture(self) -> SSLArchitecture:
        base = super().architecture()
        settings = {f.name: getattr(base, f.name) for f in fields(base)}
        return SSLArchitecture(**settings, ssl_kind=self.ssl_kind, proj_dim=self.proj_dim)

    def is_shared(self, key: str) -> bool:
        return not key.startswith("head.")

    def ssl_settings(self) -> dict[str, Any]:
        """The client objective's own keyword arguments (a temperature, a momentum)."""
        return {}

    def client_side(self) -> ClientSide:
        views = ("strong", "strong")
        return ObjectiveClientSide(
            self._client_setup(), views, self.ssl_objective, **self.ssl_settings()
        )


class FedAvgSimCLR(FedAvgSSL):
    """FedAvg-SimCLR: NT-Xent on clients (paper 000 eq 3.3).

    Args:
        temperature: NT-Xent temperature (0.5 in paper 000).
        The others: see :class:`FedAvgSSL`.
    """

    ssl_kind = "simclr"
    ssl_objective = SimCLR

    def __init__(
        self,
        network: Architecture,
        optim: Optimization = DEFAULT_OPTIMIZATION,
        proj_dim: int | None = None,
        temperature: float = 0.5,
    ) -> None:
        if not (math.isfinite(temperature) and temperature > 0):
            raise ValueError(f"model.temperature must be finite and > 0, got {temperature}")
        super().__init__(network, optim, proj_dim)
        self.temperature = temperature

    def ssl_settings(self) -> dict[str, Any]:
        return {"temperature": self.temperature}


class FedAvgSimSiam(FedAvgSSL):
    """FedAvg-SimSiam: symmetrised negative cosine with stop-gradient (paper 000 eq 3.6)."""

    ssl_kind = "simsiam"
    ssl_objective = SimSiam


class FedAvgBYOL(FedAvgSSL):
    """FedAvg-BYOL: SimSiam's loss against an EMA target that lives only during local training.

    Args:
        byol_momentum: the EMA's starting momentum, raised to 1 by a cosine schedule.
        The others: see :class:`FedAvgSSL`.
    """

    ssl_kind = "byol"
    ssl_objective = BYOL

    def __init__(
        self,
        network: Architecture,
        optim: Optimization = DEFAULT_OPTIMIZATION,
        proj_dim: int | None = None,
        byol_momentum: float = 0.99,
    ) -> None:
        if not 0 <= byol_momentum <= 1:
            raise ValueError(f"model.byol_momentum must be in [0, 1], got {byol_momentum}")
        super().__init__(network, optim, proj_dim)
        self.byol_momentum = byol_momentum

    def ssl_settings(self) -> dict[str, Any]:
        return {"ema_momentum": self.byol_momentum}
