"""FedAvg-FixMatch and FedProx-FixMatch (paper 000 3.2.1 eq 3.2; paper 001 IV-A; paper 003)."""

from __future__ import annotations

from fedlit.methods.base import DEFAULT_OPTIMIZATION, FederatedMethod
from fedlit.methods.client_side import ObjectiveClientSide
from fedlit.objectives import FixMatch, FixMatchLoss, Optimization


class FedAvgFixMatch(FederatedMethod):
    """FedAvg-FixMatch: the server trains CE on its labels and broadcasts the whole model;
    each client minimises FixMatch's unlabeled loss on (weak, strong) views of its images,
    l_u = mean_b 1[max p(alpha(u_b)) >= tau] CE(argmax p(alpha(u_b)), f(A(u_b))),
    plus (mu/2)||w - w_global||^2 when ``loss.mu > 0`` (FedProx-FixMatch); uploads are averaged
    with FedAvg weights n_k; the server fine-tunes the aggregate with CE before it is scored
    (paper 000's Algorithm 1, ``server_finetunes``).

    Args:
        loss: tau, the confidence threshold, and mu, FedProx's coefficient
            (:class:`~fedlit.objectives.FixMatchLoss`).
        The others: see :class:`FederatedMethod`.
    """

    server_finetunes = True

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

    def client_side(self) -> ObjectiveClientSide:
        views = ("weak", "strong")
        return ObjectiveClientSide(*self._client_basics(), views, FixMatch, loss=self.loss)
