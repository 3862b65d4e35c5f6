"""The shared shape of weak/strong consistency objectives (FixMatch, UDA), with FedProx."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor

from fedlit.models import Classifier
from fedlit.objectives.base import Objective, Step


@dataclass(frozen=True)
class ConsistencyLoss:
    """The hyperparameters every consistency objective shares, validated here once.

    Args:
        mu: FedProx's coefficient (Li et al. 2020); 0: no proximal term. Every objective
            that keeps these settings as ``self.loss`` honours it: its fit adds the term
            (:class:`~fedlit.objectives.fedprox.FedProx`).
    """

    mu: float = 0.0

    def __post_init__(self) -> None:
        if not (math.isfinite(self.mu) and self.mu >= 0):
            raise ValueError(f"mu must be finite and >= 0, got {self.mu}")


class WeakStrongObjective(Objective):
    """One forward pass over (weak, strong) views of unlabeled images, the subclass's
    :meth:`unlabeled_loss` (plus FedProx's term when ``loss.mu > 0``, which the fit adds:
    :meth:`~fedlit.objectives.Objective.fit_step`).

    Batches: (weak (B, C, H, W), strong (B, C, H, W)).

    Args:
        loss: the objective's settings, kept as ``self.loss`` (a subclass of
            :class:`ConsistencyLoss` for the subclass's own loss).
    """

    def __init__(self, network: Classifier, lr: float, loss: ConsistencyLoss, **kw: Any) -> None:
        super().__init__(network, lr, **kw)
        self.loss = loss

    def unlabeled_loss(self, logits_weak: Tensor, logits_strong: Tensor) -> tuple[Tensor, Tensor]:
        """(loss, mask (B,)) from the two views' logits (B, K)."""
        raise NotImplementedError

    def step(self, batch: tuple[Tensor, Tensor] | dict[str, tuple[Tensor, ...]]) -> Step:
        if isinstance(batch, dict):
            return self.joint_step(batch["unlabeled"], batch["labeled"])
        weak, strong = batch
        logits_weak, logits_strong = self.network(torch.cat([weak, strong])).chunk(2)
        loss, mask = self.unlabeled_loss(logits_weak, logits_strong)
        return loss, ((len(weak), {"loss": loss, "mask_rate": mask.mean()}),)

    def joint_step(self, unlabeled: tuple[Tensor, ...], labeled: tuple[Tensor, ...]) -> Step:
        """FixMatch's own loss, labeled and unlabeled images in one step (Sohn et al. 2020,
        eq 4 with lambda_u = 1): CE on the labeled batch's weak views plus the unlabeled loss,
        in one forward pass over (labeled, weak, strong), so that BatchNorm sees them together.
        Logged: ``loss``, ``ce`` and ``mask_rate``.

        Args:
            unlabeled: (weak (B, C, H, W), strong (B, C, H, W)).
            labeled: (x (L, C, H, W), y (L,)).
        """
        (weak, strong), (x, y) = unlabeled, labeled
        logits = self.network(torch.cat([x, weak, strong]))
        logits_x, logits_weak, logits_strong = logits.split([len(x), len(weak), len(strong)])
        ce = F.cross_entropy(logits_x.float(), y)
        unsupervised, mask = self.unlabeled_loss(logits_weak, logits_strong)
        loss = ce + unsupervised
        return loss, ((len(weak), {"loss": loss, "ce": ce, "mask_rate": mask.mean()}),)
