"""FedAvg-FixMatch and FedProx-FixMatch (paper 000 3.2.1 eq 3.2; paper 001 IV-A; paper 003)."""

from __future__ import annotations

from fedlit.methods.base import DEFAULT_OPTIMIZATION
from fedlit.methods.consistency import FedAvgConsistency
from fedlit.models import Architecture
from fedlit.objectives import FixMatch, FixMatchLoss, Optimization
from fedlit.search_space import CLIENT_SPACE, uniform


class FedAvgFixMatch(FedAvgConsistency):
    """FedAvg-FixMatch: :class:`FedAvgConsistency` whose clients minimise FixMatch's
    unlabeled loss, l_u = mean_b 1[max p(alpha(u_b)) >= tau] CE(argmax p(alpha(u_b)), f(A(u_b))),
    plus (mu/2)||w - w_global||^2 when ``loss.mu > 0`` (FedProx-FixMatch).

    Args:
        loss: tau, the confidence threshold, and mu, FedProx's coefficient
            (:class:`~fedlit.objectives.FixMatchLoss`).
        The others: see :class:`~fedlit.methods.FederatedMethod`.
    """

    #: FixMatch's threshold: its paper's ablation spans 0.7-0.99 (0.95 its default).
    search_space = {**CLIENT_SPACE, "model.init_args.loss.tau": uniform(0.7, 0.99)}

    objective_class = FixMatch

    def __init__(
        self,
        network: Architecture,
        optim: Optimization = DEFAULT_OPTIMIZATION,
        loss: FixMatchLoss = FixMatchLoss(),
    ) -> None:
        super().__init__(network, optim, loss=loss)
