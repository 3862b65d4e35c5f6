"""UDA's unlabeled consistency loss (Xie et al. 2019), with an optional FedProx term."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from torch import Tensor

from fedlit.models import Classifier
from fedlit.objectives.consistency import ConsistencyLoss, WeakStrongObjective


def uda_loss(
    logits_weak: Tensor, logits_strong: Tensor, temperature: float, threshold: float
) -> tuple[Tensor, Tensor]:
    """Confidence-masked KL(sharpen(p(alpha(u))) || p(A(u))) (UDA; paper 001 IV-A baselines).

    q = softmax(logits_weak / temperature) (sharpened, no gradient); the mask keeps examples
    whose un-sharpened weak-view confidence max p(alpha(u)) is >= ``threshold``;
    loss = 1/B sum_b mask_b * sum_c q_bc (log q_bc - log p_c(A(u_b))).

    Args:
        logits_weak: (B, K) logits on the weak views.
        logits_strong: (B, K) logits on the strong views.
        temperature: sharpening temperature (UDA: 0.4).
        threshold: confidence threshold (UDA: 0.8).

    Returns:
        (loss, mask): the scalar loss and the (B,) float mask.
    """
    weak = logits_weak.detach().float()
    mask = (weak.softmax(-1).max(-1).values >= threshold).float()
    log_q = (weak / temperature).log_softmax(-1)
    log_p = logits_strong.float().log_softmax(-1)
    kl = (log_q.exp() * (log_q - log_p)).sum(-1)
    return (kl * mask).mean(), mask


@dataclass(frozen=True)
class UDALoss(ConsistencyLoss):
    """UDA's hyperparameters (with FedProx's ``mu``), validated here once.

    Args:
        temperature: the sharpening temperature (UDA: 0.4).
        threshold: the confidence threshold (UDA: 0.8).
        mu: FedProx's coefficient; 0: none (FedAvg-UDA).
    """

    temperature: float = 0.4
    threshold: float = 0.8

    def __post_init__(self) -> None:
        super().__post_init__()
        if not (math.isfinite(self.temperature) and self.temperature > 0):
            raise ValueError(f"temperature must be finite and > 0, got {self.temperature}")
        if not 0.0 <= self.threshold <= 1.0:
            raise ValueError(f"threshold must be in [0, 1], got {self.threshold}")


class UDA(WeakStrongObjective):
    """Client objective of FedAvg-/FedProx-UDA: :func:`uda_loss` (+ FedProx's term)."""

    loss: UDALoss

    def __init__(
        self, network: Classifier, lr: float, loss: UDALoss = UDALoss(), **kw: Any
    ) -> None:
        super().__init__(network, lr, loss, **kw)

    def unlabeled_loss(self, logits_weak: Tensor, logits_strong: Tensor) -> tuple[Tensor, Tensor]:
        return uda_loss(logits_weak, logits_strong, self.loss.temperature, self.loss.threshold)
