"""FedAvg-UDA and FedProx-UDA (baselines in papers 001 and 002)."""

from __future__ import annotations

from typing import Any

from fedlit.data.client import ClientData
from fedlit.methods.base import DEFAULT_OPTIMIZATION, FederatedMethod, Payload
from fedlit.methods.plan import SERVER_FIRST_AND_FINETUNE, RoundPlan
from fedlit.objectives import UDA, Objective, Optimization, UDALoss


class FedAvgUDA(FederatedMethod):
    """FedAvg-UDA: as FedAvg-FixMatch, with UDA's soft consistency on clients,
    KL(sharpen(p(alpha(u)), T) || p(A(u))) masked by confidence
    (:func:`~fedlit.objectives.uda_loss`); ``loss.mu > 0`` adds FedProx's term (FedProx-UDA).
    The server fine-tunes the aggregate before it is scored, as FedAvg-FixMatch's.

    Args:
        loss: the sharpening temperature, the confidence threshold and FedProx's mu
            (:class:`~fedlit.objectives.UDALoss`).
        The others: see :class:`FederatedMethod`.
    """

    client_views = ("weak", "strong")

    def __init__(
        self,
        num_classes: int,
        in_channels: int,
        backbone: str = "small_cnn",
        norm: str | None = None,
        optim: Optimization = DEFAULT_OPTIMIZATION,
        loss: UDALoss = UDALoss(),
    ) -> None:
        super().__init__(num_classes, in_channels, backbone, norm, optim)
        self.loss = loss

    def round_plan(self) -> RoundPlan:
        return SERVER_FIRST_AND_FINETUNE

    def client_objective(self, payload: Payload, client: ClientData, state: Any) -> Objective:
        return UDA(self.client_model(payload), loss=self.loss, **self.client_kwargs())
