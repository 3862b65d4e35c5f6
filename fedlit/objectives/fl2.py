"""(FL)^2's client objective (Lee et al., NeurIPS 2024, arXiv 2410.23227): pseudo-labels under
client-specific adaptive thresholds (CAT) and sharpness-aware consistency regularisation (SACR)
on the confident ones."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor

from fedlit.models import Classifier
from fedlit.objectives.base import Step
from fedlit.objectives.consistency import WeakStrongObjective
from fedlit.objectives.fedseal import AttachedImages
from fedlit.objectives.fixmatch import FixMatchLoss
from fedlit.objectives.sam import SamLosses, SharpnessAware


def adaptive_thresholds(probs: Tensor) -> tuple[Tensor, Tensor]:
    """CAT: a client's thresholds from the received global model's predictions on its images.

    tau_k = 1/N sum_i max_c p_ic (the client's mean confidence), p~_k = 1/N sum_i p_i (its
    mean prediction), and class c's threshold tau_k(c) = tau_k * p~_k(c) / max_c p~_k(c).

    Args:
        probs: (N, K) softmax outputs of the received model on the client's N images.

    Returns:
        (thresholds (K,), tau_k (0-dim)), float32.
    """
    if probs.dim() != 2 or len(probs) == 0:
        raise ValueError(f"probs must be (N, K) with N > 0, got {tuple(probs.shape)}")
    probs = probs.float()
    tau = probs.max(dim=-1).values.mean()
    mean = probs.mean(dim=0)
    return tau * mean / mean.max(), tau


def thresholded_loss(
    logits_weak: Tensor, logits_strong: Tensor, thresholds: Tensor
) -> tuple[Tensor, Tensor]:
    """Pseudo-label cross-entropy under class thresholds (FixMatch's l_u, its tau the pseudo-
    label's class threshold): 1/B sum_b 1[max p(alpha(u_b)) >= tau(y^_b)] CE(y^_b, f(A(u_b))),
    y^_b = argmax p(alpha(u_b)), no gradient through the weak view.

    Returns:
        (loss, mask (B,) float).
    """
    confidence, pseudo = logits_weak.detach().float().softmax(dim=-1).max(dim=-1)
    mask = (confidence >= thresholds[pseudo]).float()
    per_example = F.cross_entropy(logits_strong.float(), pseudo, reduction="none")
    return (per_example * mask).mean(), mask


def masked_kl(logits_perturbed: Tensor, target_logits: Tensor, mask: Tensor, t: float) -> Tensor:
    """SACR's consistency term: 1/B sum_b mask_b KL(softmax(target_b) || softmax(z_b / t)),
    z the perturbed model's logits; no gradient through the target."""
    log_q = F.log_softmax(logits_perturbed.float() / t, dim=-1)
    p = target_logits.detach().float().softmax(dim=-1)
    kl = (p * (p.clamp_min(1e-12).log() - log_q)).sum(dim=-1)
    return (kl * mask).mean()


@dataclass(frozen=True)
class FL2Loss(FixMatchLoss):
    """(FL)^2's client-loss settings (its public code's defaults, ``src/config/config.yml``).

    Args:
        tau: the fixed threshold where the adaptive thresholds are off (FixMatch's 0.95).
        sam_tau: SACR's selection: the pseudo-labels at least this confident are
            regularised (0.95).
        rho: SAM's radius (0.1, constant).
        temperature: the perturbed logits' temperature in the KL term (1.0).
        mu: FedProx's coefficient; 0: none.
    """

    sam_tau: float = 0.95
    rho: float = 0.1
    temperature: float = 1.0

    def __post_init__(self) -> None:
        super().__post_init__()
        if not 0.0 <= self.sam_tau <= 1.0:
            raise ValueError(f"sam_tau must be in [0, 1], got {self.sam_tau}")
        if not (math.isfinite(self.rho) and self.rho > 0):
            raise ValueError(f"rho must be finite and > 0, got {self.rho}")
        if not (math.isfinite(self.temperature) and self.temperature > 0):
            raise ValueError(f"temperature must be finite and > 0, got {self.temperature}")


class FL2Client(AttachedImages, WeakStrongObjective):
    """(FL)^2's client: before its fit, the received model's predictions on the client's
    un-augmented images give its thresholds (:func:`adaptive_thresholds`; ``loss.tau`` for
    every class where ``adaptive`` is off) and its mean confidence tau_k (:attr:`confidence`,
    uploaded for the aggregation); each step minimises :func:`thresholded_loss` and, where
    ``sharpness_aware``, adds SACR's gradient (:meth:`sam_losses`).

    Batches: (weak (B, C, H, W), strong (B, C, H, W)).
    """

    loss: FL2Loss

    def __init__(
        self,
        network: Classifier,
        lr: float,
        loss: FL2Loss = FL2Loss(),
        adaptive: bool = True,
        sharpness_aware: bool = True,
        **kw: Any,
    ) -> None:
        super().__init__(network, lr, loss, **kw)
        self.adaptive, self.use_sam = adaptive, sharpness_aware
        #: tau_k, set by :meth:`before_fit`.
        self.confidence: Tensor | None = None
        self.thresholds = torch.full((network.num_classes,), loss.tau)

    def before_fit(self) -> None:  # its thresholds measured on the attached images
        probs = self.predict_attached(self.network)
        thresholds, self.confidence = adaptive_thresholds(probs)
        if not self.adaptive:
            thresholds = torch.full_like(thresholds, self.loss.tau)
        self.step_input("thresholds", thresholds)
        self.accumulate(1.0, confidence=self.confidence)

    def unlabeled_loss(self, logits_weak: Tensor, logits_strong: Tensor) -> tuple[Tensor, Tensor]:
        return thresholded_loss(logits_weak, logits_strong, self.thresholds)

    def sharpness_aware(self) -> SharpnessAware | None:
        return SharpnessAware(self.loss.rho) if self.use_sam else None

    def sam_losses(self, batch: tuple[Tensor, Tensor]) -> SamLosses:
        """SACR (the paper's sec. 4.2; its code's defaults): at w, the thresholded loss (its
        gradient kept) and, on the pseudo-labels at least ``loss.sam_tau`` confident, the
        pseudo-label cross-entropy whose gradient g gives eps = rho g / ||g||; at w + eps,
        :func:`masked_kl` of the perturbed model's strong-view logits to the unperturbed
        ones on those images, its gradient added."""
        weak, strong = batch
        logits_weak, logits_strong = self.network(torch.cat([weak, strong])).chunk(2)
        loss, mask = self.unlabeled_loss(logits_weak, logits_strong)
        ascent, selected = thresholded_loss(
            logits_weak, logits_strong, torch.full_like(self.thresholds, self.loss.sam_tau)
        )
        fedprox = self.fit_state.fedprox
        total = loss if fedprox is None else fedprox(self.network, loss)
        target = logits_strong.detach()
        temperature = self.loss.temperature

        def perturbed() -> Tensor:
            return masked_kl(self.network(strong), target, selected, temperature)

        logged = (
            (len(weak), {"loss": total, "mask_rate": mask.mean(), "sam_rate": selected.mean()}),
        )
        return SamLosses(total, logged, ascent, perturbed, keep=True)

    def step(self, batch: tuple[Tensor, Tensor]) -> Step:  # type: ignore[override]
        weak, strong = batch
        logits_weak, logits_strong = self.network(torch.cat([weak, strong])).chunk(2)
        loss, mask = self.unlabeled_loss(logits_weak, logits_strong)
        return loss, ((len(weak), {"loss": loss, "mask_rate": mask.mean()}),)
