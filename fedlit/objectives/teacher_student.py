"""The teacher-student EMA client objective of paper 003 (TS-Server EMA, TS-Client EMA,
FedSwitch), and the KL-to-uniform measure behind FedSwitch's switching (eq 2)."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from lightly.models.utils import update_momentum
from torch import Tensor, nn

from fedlit.models import Classifier
from fedlit.objectives.base import Step
from fedlit.objectives.consistency import WeakStrongObjective
from fedlit.objectives.ema import copy_buffers
from fedlit.objectives.fixmatch import FixMatchLoss, fixmatch_loss


def kl_to_uniform(predictions: Tensor, num_classes: int) -> Tensor:
    """D_KL(Yhat || U) of one batch's predicted labels, paper 003 eq 2 (one term of the mean).

    Yhat is the batch's distribution of predicted labels (the normalised histogram of
    ``predictions``) and U the uniform distribution over ``num_classes`` labels:
    sum_c q_c log(q_c L), with 0 log 0 = 0. 0 for a balanced batch, log(L) for one class.

    Args:
        predictions: (B,) int64 predicted labels.
        num_classes: L, the number of classes.
    """
    # the histogram by an index_add of ones (bincount reads the labels' maximum back: a sync)
    counts = torch.zeros(num_classes, dtype=torch.float64, device=predictions.device)
    counts.index_add_(0, predictions, torch.ones_like(predictions, dtype=torch.float64))
    q = counts / len(predictions)
    terms = torch.where(q > 0, q * torch.log(q * num_classes), torch.zeros_like(q))
    return terms.sum()


@dataclass(frozen=True)
class TeacherStudentLoss(FixMatchLoss):
    """The teacher-student clients' hyperparameters: FixMatch's (``tau``, FedProx's ``mu``)
    and the unlabeled loss's weight, validated here once.

    Args:
        lambda_u: weight of the unlabeled loss.
        tau: FixMatch's confidence threshold.
        mu: FedProx coefficient.
    """

    lambda_u: float = 1.0

    def __post_init__(self) -> None:
        super().__post_init__()
        if not (math.isfinite(self.lambda_u) and self.lambda_u >= 0):
            raise ValueError(f"lambda_u must be finite and >= 0, got {self.lambda_u}")


class TeacherStudentClient(WeakStrongObjective):
    """A client of the teacher-student EMA family (paper 003, Algorithms 1 and 2).

    The student S (``network``) is trained on lambda_u x FixMatch's unlabeled loss, the
    pseudo-labels coming from the teacher's (or, without a teacher, the student's own)
    prediction on the weak view, plus (mu / 2) ||S - S_global||^2 (FedProx) and, with labels at
    the client (Algorithm 1), CE on the client's labeled batch. With ``teacher_ema`` set the
    local teacher follows the student after every batch, T <- a T + (1 - a) S (lightly's
    ``update_momentum``; buffers copied), as in TS-Client EMA and FedSwitch's local teacher
    adaptation; without it the teacher stays as received (TS-Server EMA).

    Per batch it records eq 2's terms, D_KL(Yhat^T || U) of the teacher's predictions on the
    weak view (``kl/teacher``, when there is a teacher) and D_KL(Yhat^S || U) of the student's
    on the strong view (``kl/student``); their means over the client's batches are eq 2.

    Batches: (weak, strong) unlabeled views, or with labels at the client a dict
    {"unlabeled": (weak, strong), "labeled": (x, y)}.

    Args:
        teacher: the teacher network, or None (pseudo-labels from the student).
        num_classes: L, for eq 2.
        teacher_ema: the per-batch EMA decay of the local teacher (the method's
            ``client_ema_decay``); None keeps it fixed.
        loss: lambda_u, tau and mu (:class:`TeacherStudentLoss`).
    """

    loss: TeacherStudentLoss

    def __init__(
        self,
        network: Classifier,
        lr: float,
        teacher: nn.Module | None,
        num_classes: int,
        teacher_ema: float | None = None,
        loss: TeacherStudentLoss = TeacherStudentLoss(),
        **kw: Any,
    ) -> None:
        super().__init__(network, lr, loss, **kw)
        if teacher is not None:
            for p in teacher.parameters():
                p.requires_grad_(False)
        self.teacher = teacher
        self.teacher_ema = teacher_ema
        self.num_classes = num_classes

    def step(self, batch: tuple | dict) -> Step:
        labeled = None
        if isinstance(batch, dict):
            labeled, batch = batch.get("labeled"), batch["unlabeled"]
        weak, strong = batch
        if labeled is not None:
            x, y = labeled
            logits = self.network(torch.cat([weak, strong, x]))
            logits_weak, logits_strong = logits[: len(weak)], logits[len(weak) : 2 * len(weak)]
            loss_s = F.cross_entropy(logits[2 * len(weak) :].float(), y)
        else:
            logits_weak, logits_strong = self.network(torch.cat([weak, strong])).chunk(2)
            loss_s = None
        metrics: dict[str, Tensor | float] = {
            "kl/student": kl_to_uniform(logits_strong.argmax(-1), self.num_classes)
        }
        if self.teacher is not None:
            self.teacher.eval()
            with torch.no_grad():
                pseudo_logits = self.teacher(weak)
            metrics["kl/teacher"] = kl_to_uniform(pseudo_logits.argmax(-1), self.num_classes)
        else:
            pseudo_logits = logits_weak
        metrics["switch/use_teacher"] = float(self.teacher is not None)
        loss_u, mask = fixmatch_loss(pseudo_logits, logits_strong, self.loss.tau)
        loss = self.loss.lambda_u * loss_u
        if loss_s is not None:
            loss = loss + loss_s
            metrics["loss_s"] = loss_s
        per_example: dict[str, Tensor | float] = {
            "loss": loss,
            "loss_u": loss_u,
            "mask_rate": mask.mean(),
        }
        return loss, ((1.0, metrics), (len(weak), per_example))

    def after_step(self) -> None:
        if self.teacher is not None and self.teacher_ema is not None:
            update_momentum(self.network, self.teacher, self.teacher_ema)
            copy_buffers(self.network, self.teacher)
