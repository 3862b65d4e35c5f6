"""FedProx's proximal term (Li et al. 2020), one piece every objective takes through its fit."""

from __future__ import annotations

from torch import Tensor, nn


def proximal_term(network: nn.Module, anchor: list[Tensor], mu: float) -> Tensor:
    """FedProx: (mu / 2) * ||w - w_global||^2 over the trainable parameters (Li et al. 2020)."""
    params = [p for p in network.parameters() if p.requires_grad]
    sq = sum(((p - a) ** 2).sum() for p, a in zip(params, anchor, strict=True))
    return 0.5 * mu * sq  # type: ignore[return-value]


class FedProx:
    """FedProx's term for one fit: (mu / 2) * ||w - w_0||^2, w_0 the network's trainable
    parameters when it is made (a client's fit: the model it received).

    The fit makes it for every objective whose settings ``self.loss`` have a ``mu`` above 0
    (:meth:`~fedlit.objectives.Objective.fit_step`), so an objective's own
    :meth:`~fedlit.objectives.Objective.step` never adds it: a one-view objective written as
    the docs say honours ``loss.mu`` as FixMatch does.
    """

    def __init__(self, network: nn.Module, mu: float) -> None:
        self.mu = mu
        self.anchor = [p.detach().clone() for p in network.parameters() if p.requires_grad]

    def __call__(self, network: nn.Module, loss: Tensor) -> Tensor:
        """``loss`` (a scalar) plus the term at ``network``'s current weights."""
        return loss + proximal_term(network, self.anchor, self.mu)
