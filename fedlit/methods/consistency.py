"""FedAvg with a weak/strong consistency objective on clients: the shared class of
FedAvg-FixMatch and FedAvg-UDA, with FedProx's term (papers 000, 001, 002 and 003)."""

from __future__ import annotations

from typing import ClassVar

from fedlit.methods.base import DEFAULT_OPTIMIZATION, FederatedMethod
from fedlit.methods.client_side import ObjectiveClientSide
from fedlit.methods.plan import SERVER_FIRST_AND_FINETUNE, RoundPlan
from fedlit.models import Architecture
from fedlit.objectives import ConsistencyLoss, Objective, Optimization
from fedlit.search_space import CLIENT_SPACE, log_uniform


class FedAvgConsistency(FederatedMethod):
    """FedAvg whose clients train one consistency objective: the server trains CE on its
    labels and broadcasts the whole model; each client minimises :attr:`objective_class`'s
    unlabeled loss on the :attr:`views` of its images ((weak, strong) unless a subclass names
    others), plus (mu/2)||w - w_global||^2 when ``loss.mu > 0`` (FedProx); uploads are
    averaged with FedAvg weights n_k; the server fine-tunes the aggregate with CE before it is
    scored (paper 000's Algorithm 1, :data:`~fedlit.methods.plan.SERVER_FIRST_AND_FINETUNE`).
    A subclass names the objective and declares its ``loss`` settings; a method whose
    objective takes other views (one weak view, say) names them too.

    Args:
        loss: the objective's settings (a :class:`~fedlit.objectives.ConsistencyLoss`).
        The others: see :class:`FederatedMethod`.
    """

    search_space = CLIENT_SPACE
    #: FedProx's mu (FedProx: 0.001-1): a spec adds it for a FedProx recipe.
    optional_space = {"model.init_args.loss.mu": log_uniform(0.001, 1.0)}

    #: The clients' objective, built from the received model and ``loss``.
    objective_class: ClassVar[type[Objective]]
    #: The views of each unlabeled image the objective takes, in the order of its batches:
    #: FixMatch's and UDA's (weak, strong); ``("weak",)`` for an objective on one view.
    views: ClassVar[tuple[str, ...]] = ("weak", "strong")

    def __init__(
        self,
        network: Architecture,
        optim: Optimization = DEFAULT_OPTIMIZATION,
        *,
        loss: ConsistencyLoss,
    ) -> None:
        super().__init__(network, optim)
        self.loss = loss

    def round_plan(self) -> RoundPlan:
        return SERVER_FIRST_AND_FINETUNE

    def client_side(self) -> ObjectiveClientSide:
        return ObjectiveClientSide(
            self._client_setup(), self.views, self.objective_class, loss=self.loss
        )
