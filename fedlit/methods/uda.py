"""FedAvg-UDA and FedProx-UDA (baselines in papers 001 and 002)."""

from __future__ import annotations

from fedlit.methods.base import DEFAULT_OPTIMIZATION
from fedlit.methods.consistency import FedAvgConsistency
from fedlit.models import Architecture
from fedlit.objectives import UDA, Optimization, UDALoss
from fedlit.search_space import CLIENT_SPACE, uniform


class FedAvgUDA(FedAvgConsistency):
    """FedAvg-UDA: :class:`FedAvgConsistency` whose clients minimise UDA's soft consistency,
    KL(sharpen(p(alpha(u)), T) || p(A(u))) masked by confidence
    (:func:`~fedlit.objectives.uda_loss`); ``loss.mu > 0`` adds FedProx's term (FedProx-UDA).

    Args:
        loss: the sharpening temperature, the confidence threshold and FedProx's mu
            (:class:`~fedlit.objectives.UDALoss`).
        The others: see :class:`~fedlit.methods.FederatedMethod`.
    """

    #: UDA's sharpening temperature (its paper: 0.4) and confidence threshold (0.8).
    search_space = {
        **CLIENT_SPACE,
        "model.init_args.loss.temperature": uniform(0.3, 1.0),
        "model.init_args.loss.threshold": uniform(0.5, 0.95),
    }

    objective_class = UDA

    def __init__(
        self,
        network: Architecture,
        optim: Optimization = DEFAULT_OPTIMIZATION,
        loss: UDALoss = UDALoss(),
    ) -> None:
        super().__init__(network, optim, loss=loss)
