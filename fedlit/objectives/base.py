"""The shared base of every server and client objective."""

from __future__ import annotations

import copy

import torch
from lightly.models.utils import deactivate_requires_grad
from lightning import LightningModule
from torch import Tensor, nn

OPTIMIZERS = ("sgd", "adam")


def frozen_copy(module: nn.Module) -> nn.Module:
    """A deep copy of ``module`` with every parameter's gradient switched off (a target net)."""
    clone = copy.deepcopy(module)
    deactivate_requires_grad(clone)
    return clone


class Objective(LightningModule):
    """One training objective on ``network``: a loss in ``training_step`` and its optimiser.

    Objectives are built afresh by a method for every server step and every client step, so the
    round-dependent parts (loss weights, learning-rate decay across rounds) are given to them by
    the federation driver, never read from Lightning's ``global_step``, which restarts with every
    Trainer. Metrics are accumulated here (no ``self.log``: client Trainers run bare) and read by
    the driver with :meth:`epoch_metrics`.
    """

    def __init__(
        self,
        network: nn.Module,
        lr: float,
        optimizer: str = "sgd",
        momentum: float = 0.9,
        weight_decay: float = 0.0,
    ) -> None:
        super().__init__()
        if optimizer not in OPTIMIZERS:
            raise ValueError(f"optimizer must be one of {OPTIMIZERS}, got {optimizer!r}")
        self.network = network
        self.lr = lr
        self.optimizer_name = optimizer
        self.momentum = momentum
        self.weight_decay = weight_decay
        self._sums: dict[str, Tensor] = {}
        self._weights: dict[str, float] = {}

    def forward(self, x: Tensor) -> Tensor:
        return self.network(x)

    def configure_optimizers(self) -> torch.optim.Optimizer:
        params = [p for p in self.parameters() if p.requires_grad]
        if self.optimizer_name == "adam":
            return torch.optim.Adam(params, lr=self.lr, weight_decay=self.weight_decay)
        return torch.optim.SGD(
            params, lr=self.lr, momentum=self.momentum, weight_decay=self.weight_decay
        )

    def accumulate(self, weight: float = 1.0, **values: Tensor) -> None:
        """Add ``values`` (scalars), weighted by ``weight``, to the running means."""
        for name, value in values.items():
            v = value.detach().float() * weight
            self._sums[name] = self._sums[name] + v if name in self._sums else v
            self._weights[name] = self._weights.get(name, 0.0) + weight

    def epoch_metrics(self) -> dict[str, float]:
        """Means of everything accumulated since the objective was built."""
        return {k: float(v) / self._weights[k] for k, v in self._sums.items()}
