"""FedAvg-UDA and FedProx-UDA (baselines in papers 001 and 002)."""

from __future__ import annotations

from typing import Any

from fedlit.methods.base import FederatedMethod, Payload
from fedlit.objectives import UDA, Objective


class FedAvgUDA(FederatedMethod):
    """FedAvg-UDA: as FedAvg-FixMatch, with UDA's soft consistency on clients,
    KL(sharpen(p(alpha(u)), T) || p(A(u))) masked by confidence
    (:func:`~fedlit.objectives.uda_loss`); ``mu > 0`` adds FedProx's term (FedProx-UDA). The
    server fine-tunes the aggregate before it is scored, as FedAvg-FixMatch's.

    Args:
        temperature: sharpening temperature (UDA's 0.4).
        threshold: confidence threshold (UDA's 0.8).
        mu: FedProx coefficient; 0 gives FedAvg-UDA.
        **kwargs: see :class:`FederatedMethod`.
    """

    client_views = ("weak", "strong")
    server_finetunes = True

    def __init__(
        self,
        *args: Any,
        temperature: float = 0.4,
        threshold: float = 0.8,
        mu: float = 0.0,
        **kwargs: Any,
    ) -> None:
        if temperature <= 0:
            raise ValueError(f"model.temperature must be > 0, got {temperature}")
        if not 0 <= threshold <= 1:
            raise ValueError(f"model.threshold must be in [0, 1], got {threshold}")
        if mu < 0:
            raise ValueError(f"model.mu must be >= 0, got {mu}")
        super().__init__(*args, **kwargs)
        self.temperature, self.threshold, self.mu = temperature, threshold, mu

    def client_objective(
        self, payload: Payload, round_idx: int, total_rounds: int, state: Any
    ) -> Objective:
        return UDA(
            self.client_model(payload),
            temperature=self.temperature,
            threshold=self.threshold,
            mu=self.mu,
            **self.optimizer_kwargs(self.client_lr, round_idx, total_rounds),
        )
