"""FedAvg-FixMatch and FedProx-FixMatch (paper 000 3.2.1 eq 3.2; paper 001 IV-A; paper 003)."""

from __future__ import annotations

from typing import Any

from fedlit.data.client import ClientData
from fedlit.methods.base import DEFAULT_OPTIMIZATION, FederatedMethod, Payload
from fedlit.methods.plan import SERVER_FIRST_AND_FINETUNE, RoundPlan
from fedlit.objectives import FixMatch, FixMatchLoss, Objective, Optimization


class FedAvgFixMatch(FederatedMethod):
    """FedAvg-FixMatch: the server trains CE on its labels and broadcasts the whole model;
    each client minimises FixMatch's unlabeled loss on (weak, strong) views of its images,
    l_u = mean_b 1[max p(alpha(u_b)) >= tau] CE(argmax p(alpha(u_b)), f(A(u_b))),
    plus (mu/2)||w - w_global||^2 when ``loss.mu > 0`` (FedProx-FixMatch); uploads are averaged
    with FedAvg weights n_k; the server fine-tunes the aggregate with CE before it is scored
    (paper 000's Algorithm 1, :data:`~fedlit.methods.plan.SERVER_FIRST_AND_FINETUNE`).

    Args:
        loss: tau, the confidence threshold, and mu, FedProx's coefficient
            (:class:`~fedlit.objectives.FixMatchLoss`).
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
        loss: FixMatchLoss = FixMatchLoss(),
    ) -> None:
        super().__init__(num_classes, in_channels, backbone, norm, optim)
        self.loss = loss

    def round_plan(self) -> RoundPlan:
        return SERVER_FIRST_AND_FINETUNE

    def client_objective(self, payload: Payload, client: ClientData, state: Any) -> Objective:
        return FixMatch(self.client_model(payload), loss=self.loss, **self.client_kwargs())
