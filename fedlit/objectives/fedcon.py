"""FedCon's server and client objectives (paper 001, section III)."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from lightly.models.utils import deactivate_requires_grad, update_momentum
from torch import Tensor

from fedlit.models import Classifier
from fedlit.objectives.base import Objective, Step
from fedlit.objectives.ema import frozen_copy
from fedlit.objectives.schedules import ramped_decay


def prob_consistency(logits_online: Tensor, logits_target: Tensor) -> Tensor:
    """J = 1/B sum_b ||softmax(c_theta) - softmax(c_xi)||^2 (paper 001 eq 3); (B, K) -> scalar."""
    diff = logits_online.float().softmax(-1) - logits_target.detach().float().softmax(-1)
    return diff.pow(2).sum(-1).mean()


def server_loss(
    online_1: Tensor, online_2: Tensor, target_1: Tensor, target_2: Tensor, labels: Tensor
) -> tuple[Tensor, Tensor, Tensor]:
    """L_S = (L_theta + J + L~ + J~) / 2 (paper 001 eqs 2-4), with its CE and J halves.

    The logits (n + m, K) of the online and target nets on view 1 and on view 2 of the same
    images: the first n = len(labels) rows labeled, the other m the server's unlabeled images
    (section IV-E; m = 0 without them). CE on the n labeled rows of each view; J (eq 3) over all
    n + m rows, online on one view against target on the other; both symmetrised.
    Returns (L_S, (L_theta + L~) / 2, (J + J~) / 2).
    """
    n = len(labels)
    ce = F.cross_entropy(online_1[:n], labels) + F.cross_entropy(online_2[:n], labels)
    consistency = prob_consistency(online_1, target_2) + prob_consistency(online_2, target_1)
    return (ce + consistency) / 2, ce / 2, consistency / 2


def projection_mse(z_online: Tensor, z_target: Tensor) -> Tensor:
    """L = 1/B sum_b ||z_theta - z'_xi||_2^2 (paper 001 eq 5); (B, D) -> scalar."""
    return (z_online.float() - z_target.detach().float()).pow(2).sum(-1).mean()


class FedConServer(Objective):
    """Server objective: L_S = (L_theta + J + L~ + J~) / 2 (paper 001 eqs 2-4).

    CE of the online net on each of two weak views, and the consistency J between the online
    net's probabilities on one view and the target net's on the other, both symmetrised. After
    every step, xi <- tau xi + (1 - tau) theta with ``tau = ramped_decay(step, ema_decay)``;
    ``start_step`` continues the step count across rounds (the driver keeps it).
    Batches: (view_1, view_2 (B, C, H, W), y (B,)); with the server's unlabeled images (paper
    001 section IV-E) a dict {"labeled": (view_1, view_2, y), "unlabeled": (view_1, view_2)},
    whose unlabeled images get J only (:func:`server_loss`).
    """

    def __init__(
        self,
        network: Classifier,
        target: Classifier,
        lr: float,
        ema_decay: float = 0.999,
        start_step: int = 0,
        **kw,
    ) -> None:
        super().__init__(network, lr, **kw)
        deactivate_requires_grad(target)
        self.target = target
        self.ema_decay = ema_decay
        self.steps_done = start_step

    def step(self, batch: tuple[Tensor, Tensor, Tensor] | dict[str, tuple[Tensor, ...]]) -> Step:
        labeled, unlabeled = (
            (batch["labeled"], batch["unlabeled"]) if isinstance(batch, dict) else (batch, ())
        )
        v1, v2, y = labeled
        if unlabeled:  # labeled rows first: server_loss takes CE on them only
            v1, v2 = torch.cat([v1, unlabeled[0]]), torch.cat([v2, unlabeled[1]])
        c1, c2 = self.network(torch.cat([v1, v2])).chunk(2)
        with torch.no_grad():
            t1, t2 = self.target(torch.cat([v1, v2])).chunk(2)
        loss, ce, consistency = server_loss(c1, c2, t1, t2, y)
        return loss, ((len(y), {"loss": loss, "ce": ce, "consistency": consistency}),)

    def after_step(self) -> None:
        update_momentum(self.network, self.target, ramped_decay(self.steps_done, self.ema_decay))
        self.steps_done += 1


class FedConClient(Objective):
    """Client objective: L_C = (L + L~) / 2, L = ||p(b_theta(x + eta)) - b_xi(x + eta')||^2
    (paper 001 eqs 5-6), with the target backbone b_xi an EMA of the online backbone
    (xi <- mu xi + (1 - mu) theta after each step) and a stop-gradient on it.

    The network has ``backbone`` and ``projector`` (the client's own, kept across rounds);
    the target starts each round as a copy of the received backbone.
    Batches: (view_1, view_2 (B, C, H, W)).
    """

    def __init__(self, network: Classifier, lr: float, ema_decay: float = 0.999, **kw) -> None:
        super().__init__(network, lr, **kw)
        self.ema_decay = ema_decay
        self.target_backbone = frozen_copy(network.backbone)

    def step(self, batch: tuple[Tensor, Tensor]) -> Step:
        v1, v2 = batch
        z1, z2 = self.network.projection(self.network.backbone(torch.cat([v1, v2]))).chunk(2)
        with torch.no_grad():
            t1, t2 = self.target_backbone(torch.cat([v1, v2])).chunk(2)
        loss = (projection_mse(z1, t2) + projection_mse(z2, t1)) / 2
        return loss, ((len(v1), {"loss": loss}),)

    def after_step(self) -> None:
        update_momentum(self.network.backbone, self.target_backbone, self.ema_decay)
