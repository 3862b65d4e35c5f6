"""SemiFL's client loss (Diao, Ding and Tarokh, NeurIPS 2022): the "fix" loss on confident
pseudo-labels and the "mix" loss on mixup of them, the pseudo-labels fixed for the round."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor

from fedlit.models import Classifier
from fedlit.objectives.base import Objective, Step
from fedlit.objectives.fedseal import AttachedImages
from fedlit.objectives.fixmatch import FixMatchLoss
from fedlit.objectives.mixing import beta_draws, mixup, mixup_cross_entropy


def confident_labels(probs: Tensor, tau: float) -> tuple[Tensor, Tensor]:
    """Hard pseudo-labels and their confidence mask: (argmax p (N,), 1[max p >= tau] (N,)
    float32), from probabilities (N, K)."""
    confidence, labels = probs.float().max(dim=-1)
    return labels, (confidence >= tau).float()


@dataclass(frozen=True)
class SemiFLLoss(FixMatchLoss):
    """SemiFL's client-loss settings (its public code's defaults), with FedProx's ``mu``.

    Args:
        tau: the confidence threshold of a pseudo-label (SemiFL: 0.95).
        alpha: mixup's lam ~ Beta(alpha, alpha) (SemiFL: 0.75).
        mix_weight: the mix loss's weight beside the fix loss (SemiFL: 1, their sum).
        mu: FedProx's coefficient; 0: none.
    """

    tau: float = 0.95
    alpha: float = 0.75
    mix_weight: float = 1.0

    def __post_init__(self) -> None:
        super().__post_init__()
        if not (math.isfinite(self.alpha) and self.alpha > 0):
            raise ValueError(f"loss.alpha must be finite and > 0, got {self.alpha}")
        if not (math.isfinite(self.mix_weight) and self.mix_weight >= 0):
            raise ValueError(f"loss.mix_weight must be finite and >= 0, got {self.mix_weight}")


class SemiFLClient(AttachedImages, Objective):
    """SemiFL's client objective (its Algorithm 1): L = L_fix + w L_mix, each a mean over the
    batch's confident examples (0 where there is none).

    Global pseudo-labels (``global_labels``, SemiFL's): before training (:meth:`before_fit`)
    the received model, in eval mode (its BatchNorm statistics as received: the server's
    static ones under sBN), labels every image of the client once, un-augmented:
    y = argmax p(x), m = 1[max p(x) >= tau]; they stay fixed while the client trains.
    Otherwise (FixMatch's local rule) each batch is labeled by the network being trained, on
    its weak views. Then

    - L_fix = sum_b m_b CE(f(A(x_b)), y_b) / sum_b m_b on the strong views A(x);
    - L_mix = sum_b m_b [lam CE(f(x~_b), y_b) + (1 - lam) CE(f(x~_b), y_{b-1})] / sum_b m_b,
      x~_b = lam alpha(x_b) + (1 - lam) alpha(x_{b-1}) on the weak views alpha(x), with
      lam ~ Beta(loss.alpha, loss.alpha) drawn once a step
      (:func:`~fedlit.objectives.mixing.mixup`).

    Batches: (index (B,), weak (B, C, H, W), strong (B, C, H, W)), index being the example's
    position in the client's data.

    Args:
        loss: tau, alpha, the mix loss's weight and FedProx's mu (:class:`SemiFLLoss`).
        global_labels: label once with the received model (SemiFL) or each batch (FixMatch).
        mix: add the mix loss.
    """

    def __init__(
        self,
        network: Classifier,
        lr: float,
        loss: SemiFLLoss = SemiFLLoss(),
        global_labels: bool = True,
        mix: bool = True,
        **kw: Any,
    ) -> None:
        super().__init__(network, lr, **kw)
        self.loss, self.global_labels, self.mix = loss, global_labels, mix
        # the round's pseudo-labels and mask over the client's images, and the fit's mixing
        # weights with the step that reads them, set as training starts (step_input)
        self.pseudo = torch.empty(0, dtype=torch.long)
        self.confident = torch.empty(0)
        self.lams = torch.full((1,), 0.5)
        self.lam_step = torch.zeros((), dtype=torch.long)

    def before_fit(self) -> None:
        if self.global_labels:
            probs = self.predict_attached(self.network)
            pseudo, confident = confident_labels(probs, self.loss.tau)
            self.step_input("pseudo", pseudo)
            self.step_input("confident", confident)
            self._log_labels(pseudo, confident)
        if self.mix:
            self.step_input("lams", beta_draws(self.loss.alpha, max(self.planned_steps(), 1)))
            self.step_input("lam_step", torch.zeros((), dtype=torch.long))

    def after_step(self) -> None:
        if self.mix:
            self.lam_step.add_(1)  # on the device: nothing read back

    def _log_labels(self, pseudo: Tensor, confident: Tensor) -> None:
        """The confident fraction of the client's images and, with the hidden labels, the
        confident pseudo-labels' accuracy (one read)."""
        counts = [confident.sum()]
        if self.hidden_labels is not None:
            counts.append(((pseudo == self.hidden_labels).float() * confident).sum())
        values = torch.stack(counts).tolist()
        n, kept = len(pseudo), values[0]
        self.accumulate(float(n), **{"pseudo/frac": kept / n if n else math.nan})
        if self.hidden_labels is not None and kept:
            self.accumulate(kept, **{"pseudo/acc": values[1] / kept})

    def step(self, batch: tuple[Tensor, Tensor, Tensor]) -> Step:
        index, weak, strong = batch
        if self.global_labels:
            pseudo = self.pseudo.index_select(0, index)
            confident = self.confident.index_select(0, index)
        else:
            with torch.no_grad():
                pseudo, confident = confident_labels(self.network(weak).softmax(-1), self.loss.tau)
        count = confident.sum().clamp(min=1.0)
        ce = F.cross_entropy(self.network(strong).float(), pseudo, reduction="none")
        fix = (ce * confident).sum() / count
        if not self.mix:
            return fix, ((len(index), {"loss": fix, "mask_rate": confident.mean()}),)
        lam = self.lams.index_select(0, self.lam_step.remainder(len(self.lams)).view(1))[0]
        per_example = mixup_cross_entropy(self.network(mixup(weak, lam)), pseudo, lam)
        mixed = (per_example * confident).sum() / count
        loss = fix + self.loss.mix_weight * mixed
        logged = {"loss": loss, "fix": fix, "mix": mixed, "mask_rate": confident.mean()}
        return loss, ((len(index), logged),)
