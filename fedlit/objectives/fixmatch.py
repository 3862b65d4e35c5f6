"""FixMatch's unlabeled loss, with an optional FedProx proximal term."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from fedlit.objectives.base import Objective


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


def proximal_term(network: nn.Module, anchor: list[Tensor], mu: float) -> Tensor:
    """FedProx: (mu / 2) * ||w - w_global||^2 over the trainable parameters (Li et al. 2020)."""
    params = [p for p in network.parameters() if p.requires_grad]
    sq = sum(((p - a) ** 2).sum() for p, a in zip(params, anchor, strict=True))
    return 0.5 * mu * sq  # type: ignore[return-value]


class FixMatch(Objective):
    """Client objective of FedAvg-/FedProx-FixMatch: :func:`fixmatch_loss` + :func:`proximal_term`.

    Batches: (weak (B, C, H, W), strong (B, C, H, W)) views of the same unlabeled images. Both
    views go through the network in one forward pass. With ``mu > 0`` the anchor is the model
    the client received this round.
    """

    def __init__(
        self, network: nn.Module, lr: float, tau: float = 0.95, mu: float = 0.0, **kw
    ) -> None:
        super().__init__(network, lr, **kw)
        if not 0.0 <= tau <= 1.0:
            raise ValueError(f"tau must be in [0, 1], got {tau}")
        if mu < 0:
            raise ValueError(f"mu must be >= 0, got {mu}")
        self.tau, self.mu = tau, mu
        self.anchor = (
            [p.detach().clone() for p in network.parameters() if p.requires_grad] if mu > 0 else []
        )

    def on_fit_start(self) -> None:
        self.anchor = [a.to(self.device) for a in self.anchor]

    def training_step(self, batch: tuple[Tensor, Tensor], batch_idx: int) -> Tensor:
        weak, strong = batch
        logits_weak, logits_strong = self.network(torch.cat([weak, strong])).chunk(2)
        loss, mask = fixmatch_loss(logits_weak, logits_strong, self.tau)
        if self.mu > 0:
            loss = loss + proximal_term(self.network, self.anchor, self.mu)
        self.accumulate(len(weak), loss=loss, mask_rate=mask.mean())
        return loss
