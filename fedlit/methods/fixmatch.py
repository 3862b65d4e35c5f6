"""FedAvg-FixMatch and FedProx-FixMatch (paper 000 3.2.1 eq 3.2; paper 001 IV-A; paper 003)."""

from __future__ import annotations

from typing import Any

from fedlit.methods.base import FederatedMethod, Payload
from fedlit.objectives import FixMatch, Objective


class FedAvgFixMatch(FederatedMethod):
    """FedAvg-FixMatch: the server trains CE on its labels and broadcasts the whole model;
    each client minimises FixMatch's unlabeled loss on (weak, strong) views of its images,
    l_u = mean_b 1[max p(alpha(u_b)) >= tau] CE(argmax p(alpha(u_b)), f(A(u_b))),
    plus (mu/2)||w - w_global||^2 when ``mu > 0`` (FedProx-FixMatch); uploads are averaged
    with FedAvg weights n_k; the server fine-tunes the aggregate with CE before it is scored
    (paper 000's Algorithm 1, ``server_finetunes``).

    Args:
        tau: confidence threshold (0.95 in FixMatch and paper 004).
        mu: FedProx coefficient; 0 gives FedAvg-FixMatch.
        **kwargs: see :class:`FederatedMethod`.
    """

    client_views = ("weak", "strong")
    server_finetunes = True

    def __init__(self, *args: Any, tau: float = 0.95, mu: float = 0.0, **kwargs: Any) -> None:
        if not 0.0 <= tau <= 1.0:
            raise ValueError(f"model.tau must be in [0, 1], got {tau}")
        if mu < 0:
            raise ValueError(f"model.mu must be >= 0, got {mu}")
        super().__init__(*args, **kwargs)
        self.tau, self.mu = tau, mu

    def client_objective(
        self, payload: Payload, round_idx: int, total_rounds: int, state: Any
    ) -> Objective:
        network = self.client_model(payload)
        kw = self.optimizer_kwargs(self.client_lr, round_idx, total_rounds)
        return FixMatch(network, tau=self.tau, mu=self.mu, **kw)
