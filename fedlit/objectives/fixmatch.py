"""FixMatch's unlabeled loss (Sohn et al. 2020), and self-training on one view (paper 004)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch.nn.functional as F
from torch import Tensor

from fedlit.models import Classifier
from fedlit.objectives.base import Step
from fedlit.objectives.consistency import ConsistencyLoss, WeakStrongObjective


def fixmatch_loss(logits_weak: Tensor, logits_strong: Tensor, tau: float) -> tuple[Tensor, Tensor]:
    """Confidence-masked pseudo-label cross-entropy (FixMatch; paper 000 eq 3.2, paper 004 eq 6).

    l_u = 1/B sum_b 1[max p(alpha(u_b)) >= tau] * CE(argmax p(alpha(u_b)), f(A(u_b))).

    Args:
        logits_weak: (B, K) logits on the weak views; no gradient flows through them.
        logits_strong: (B, K) logits on the strong views.
        tau: confidence threshold.

    Returns:
        (loss, mask): the scalar loss and the (B,) float mask of confident examples.
    """
    probs = logits_weak.detach().float().softmax(dim=-1)
    confidence, pseudo = probs.max(dim=-1)
    mask = (confidence >= tau).float()
    per_example = F.cross_entropy(logits_strong.float(), pseudo, reduction="none")
    return (per_example * mask).mean(), mask


@dataclass(frozen=True)
class FixMatchLoss(ConsistencyLoss):
    """FixMatch's hyperparameters (with FedProx's ``mu``), validated here once: every method
    whose clients use a confidence-masked pseudo-label loss takes them as its ``loss``.

    Args:
        tau: the confidence threshold (FixMatch and paper 004: 0.95; paper 002 Table 1: 0.9).
        mu: FedProx's coefficient; 0: none.
    """

    tau: float = 0.95

    def __post_init__(self) -> None:
        super().__post_init__()
        if not 0.0 <= self.tau <= 1.0:  # False for NaN too
            raise ValueError(f"tau must be in [0, 1], got {self.tau}")


class FixMatch(WeakStrongObjective):
    """Client objective of FedAvg-/FedProx-FixMatch: :func:`fixmatch_loss` (+ FedProx's term)."""

    loss: FixMatchLoss

    def __init__(
        self, network: Classifier, lr: float, loss: FixMatchLoss = FixMatchLoss(), **kw: Any
    ) -> None:
        super().__init__(network, lr, loss, **kw)

    def unlabeled_loss(self, logits_weak: Tensor, logits_strong: Tensor) -> tuple[Tensor, Tensor]:
        return fixmatch_loss(logits_weak, logits_strong, self.loss.tau)


class SelfTraining(FixMatch):
    """ "Traditional self-training", paper 004 eq 3 (the weak baseline FedRGD's eq 6 replaces):
    the pseudo-label and the loss come from the same weak view,
    l = 1/B sum_b 1[max p(alpha(u_b)) >= tau] CE(argmax p(alpha(u_b)), f(alpha(u_b))),
    with no gradient through the pseudo-label (+ FedProx's term when ``mu > 0``).

    Batches: (weak (B, C, H, W),).
    """

    def step(self, batch: tuple[Tensor]) -> Step:  # type: ignore[override]
        (weak,) = batch
        logits = self.network(weak)
        loss, mask = fixmatch_loss(logits, logits, self.loss.tau)
        return loss, ((len(weak), {"loss": loss, "mask_rate": mask.mean()}),)
