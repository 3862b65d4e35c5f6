"""Supervised cross-entropy: the server objective of every method, and FedAvg-SL's client."""

from __future__ import annotations

import torch.nn.functional as F
from torch import Tensor

from fedlit.objectives.base import Hits, Objective, Step


class SupervisedCE(Objective):
    """L_s = 1/N_s sum_i CE(y_i, f(alpha(x_i))) (paper 004 eq 2; paper 002 section 4).

    Batches: (x (B, C, H, W) augmented, y (B,) int64).
    """

    def step(self, batch: tuple[Tensor, Tensor]) -> Step:
        x, y = batch
        logits = self.network(x)
        loss = F.cross_entropy(logits, y)
        return loss, ((len(y), {"loss": loss, "acc": Hits(logits, y)}),)
